"""A network split over two members of a model-parallel group, the leader's and the member's
handling of the group's messages (``roles.model.group``) with every message carried through the
wire format (encoded, then decoded): a step gives the loss and gradients of the unpartitioned
network (to 1e-5), for the mlp, din (a sequence and its lengths), dlrm, dcn and a user's module;
the plans of every built-in (inputs and output on the leader, no value that is not a float
tensor cut); the flat weights in the network's own parameter order, gathered from the members
before the replica reads them and loaded into them after; a network torch.fx cannot trace is
one line. The worker's side (``roles.worker.group_link``): the group's work waits through the
worker's loop, never blocking it, and a member that does not answer fails the group."""

import re
import textwrap
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch

from roles.algorithms.worker.replica import Replica
from roles.job.settings import Job, parse_job
from roles.model.graph import (
    differentiable,
    example_inputs,
    plan_graph,
    plan_job,
    task_graph,
    trace,
    trace_job,
    traced_network,
)
from roles.model.group import GroupLeader, MemberServer, Sends
from roles.model.network import build_network, weighted_loss_sum
from roles.model.networks import NetworkError, input_names, sample_batch
from roles.model.parallel import Program, flat_layout
from roles.model.partitioner import PartitionSettings
from roles.protocol.model_parallel import MemberReply, MemberTensors
from zbus.codec import Message, ProtocolError, decode

JOB = parse_job("""
name = "mp"
[data]
source = "synthetic"
[data.synthetic]
vocab = [10, 20, 30, 40]
dense = 5
[model]
embedding_dim = 8
hidden = [64, 64, 32]
[train]
batch_size = 32
sync = "every"
[cluster]
workers = 1
parts = 2
""")


def split(owner_of_member_1: set[str]) -> dict[str, int]:
    gm = trace(traced_network(JOB), example_inputs(JOB, 4))
    return {n.name: int(n.name in owner_of_member_1) for n in gm.graph.nodes}


def wire(msg: Message) -> Message:
    """The message as its receiver reads it off the bus."""
    return decode(msg.to_frames("worker-0", 0)).msg


class Group:
    """A group of two, each side with its own trace of the network: the leader (member 0, its
    replica the group's weights) and member 1; ``exchange`` carries the messages between them,
    in the order they were sent, until none is left."""

    def __init__(self, job: Job, owner: dict[str, int]):
        self.gm = trace(traced_network(job), example_inputs(job, 4))
        self.program = Program(self.gm, owner, 0, torch.device("cpu"))
        self.leader = GroupLeader(self.gm, self.program)
        self.replica = Replica(self.leader.weights, 1e-3)
        member_gm = trace(traced_network(job), example_inputs(job, 4))
        self.member = MemberServer(Program(member_gm, owner, 1, torch.device("cpu")), lr=1e-3)

    def exchange(self, sends: Sends) -> None:
        queue = deque(sends)
        while queue:
            to, msg = queue.popleft()
            queue.extend(self.leader.take(wire(msg)) if to == 0 else
                         self.member.handle(wire(msg)))

    def forward(self, inputs: dict[str, torch.Tensor], train: bool) -> torch.Tensor:
        self.exchange(self.leader.forward(inputs, train))
        output = self.leader.output()
        assert output is not None
        return output

    def backward(self, output_grad: torch.Tensor) -> None:
        self.exchange(self.leader.backward(output_grad))
        assert self.leader.backward_done()

    def on_weights(self, op):
        """``op`` on the replica between a gather and a scatter, as the worker runs it."""
        self.exchange(self.leader.gather())
        assert self.leader.gathered()
        result = op()
        self.exchange(self.leader.scatter())
        assert self.leader.scattered()
        return result

    def flat(self) -> np.ndarray:
        return self.on_weights(self.replica.flat)

    def load(self, values: np.ndarray) -> None:
        self.on_weights(lambda: self.replica.load(values))


@pytest.fixture
def group():
    """A group whose network is cut in the middle: a cut out and a cut back."""
    return Group(JOB, split({"net_mlp_2", "net_mlp_3", "net_mlp_4"}))


def batch(seed: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four fields' embeddings [32, 8], the dense features, labels and weights."""
    g = torch.Generator().manual_seed(seed)
    return ([torch.randn(32, 8, generator=g) for _ in range(4)], torch.randn(32, 5, generator=g),
            torch.randint(0, 2, (32,), generator=g).float(), torch.rand(32, generator=g))


def named(emb: list[torch.Tensor], dense: torch.Tensor) -> dict[str, torch.Tensor]:
    """The inputs by the traced network's placeholder names."""
    return {**{f"s{i}": e for i, e in enumerate(emb)}, "dense": dense}


def test_a_two_part_step_equals_the_unpartitioned_step(group):
    reference = traced_network(JOB)
    group.load(np.concatenate([p.detach().reshape(-1).numpy() for p in reference.parameters()]))
    ref_adam = torch.optim.Adam(reference.parameters(), lr=1e-3)
    for step in range(3):  # each side takes its Adam steps: the weights stay equal
        emb, dense, labels, weights = batch(step)
        # unpartitioned
        ref_emb = [e.clone().requires_grad_(True) for e in emb]
        ref_loss = weighted_loss_sum(reference(*ref_emb, dense), labels, weights)
        reference.zero_grad()
        (ref_loss / weights.sum()).backward()
        ref_grads = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
        # the group
        mp_emb = [e.clone().requires_grad_(True) for e in emb]
        logits = group.forward(named(mp_emb, dense), train=True)
        leaf = logits.detach().requires_grad_(True)
        loss = weighted_loss_sum(leaf, labels, weights)
        (loss / weights.sum()).backward()
        group.backward(leaf.grad)
        assert float(loss.detach()) == pytest.approx(float(ref_loss.detach()), abs=1e-5)
        assert all(torch.allclose(m.grad, r.grad, atol=1e-5)
                   for m, r in zip(mp_emb, ref_emb, strict=True))
        own = {n: p.grad for n, p in group.program.params.items()}
        grads = []
        for name, _ in reference.named_parameters():
            got = own[name] if name in own else group.member.program.params[name].grad
            grads.append(got.reshape(-1))
        assert torch.allclose(torch.cat(grads), ref_grads, atol=1e-5)
        ref_adam.step()
        group.replica.optimizer.step()  # the member stepped its own when its backward was done
    assert group.member.steps == 3


ITEMS = """
[data.synthetic]
items = 200
history = 6
genres = 10
vocab = [10, 20, 30]
dense = 3
[model.pooling]
history = "none"
[model.max_len]
history = 6
genres = 3
"""

# a user's module: its parameters registered in another order than its forward uses them
# (head first, used last; spare used by no node), and values that are not float tensors
# (a bool mask made from the lengths, the batch size read from a shape at the very end)
REORDERED = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, sparse_dims, sequence_fields, dense_count):
        super().__init__()
        self.fields = list(sparse_dims)
        self.head = nn.Linear(16, 1)
        width = sum(sparse_dims.values()) - sparse_dims["history"] + 8 + dense_count
        self.body = nn.Linear(width, 16)
        self.seq = nn.Linear(sparse_dims["history"], 8)
        self.spare = nn.Parameter(torch.zeros(3))

    def forward(self, sparse, dense, lengths):
        seq = sparse["history"]
        mask = torch.arange(seq.shape[1], device=seq.device)[None, :] \\
            < lengths["history"][:, None]
        pooled = (self.seq(seq) * mask.unsqueeze(2)).sum(1)
        rest = [sparse[f] if f != "history" else pooled for f in self.fields]
        hidden = torch.relu(self.body(torch.cat([*rest, dense], dim=1)))
        return self.head(hidden).view(seq.shape[0])


def build(sparse_dims, sequence_fields, dense_count, options):
    return Net(sparse_dims, sequence_fields, dense_count)
"""


def items_job(model: str, where: Path | None = None, module: str = "") -> Job:
    text = (f'name = "mp"\n[data]\nsource = "synthetic"\n{ITEMS}\n[model]\n{model}\n'
            '[train]\nbatch_size = 32\nsync = "every"\n[cluster]\nparts = 2\n')
    if where is None:
        return parse_job(text, environ={})
    (where / "net.py").write_text(textwrap.dedent(module))
    (where / "job.toml").write_text(text)
    return parse_job(text, origin=str(where / "job.toml"), base_dir=where, environ={})


def criteo_job(network: str) -> Job:
    """A Criteo-like layout on synthetic data: 26 categorical fields, 13 dense features."""
    vocab = ", ".join(str(10 + 3 * i) for i in range(26))
    return parse_job(f'name = "mp"\n[data]\nsource = "synthetic"\n[data.synthetic]\n'
                     f'vocab = [{vocab}]\ndense = 13\n[model]\nnetwork = "{network}"\n'
                     'embedding_dim = 8\nhidden = [64, 32]\n[train]\nbatch_size = 32\n'
                     'sync = "every"\n[cluster]\nparts = 2\n', environ={})


def job_inputs(job: Job, seed: int, rows: int = 32) -> tuple[list[torch.Tensor], ...]:
    """A batch in the traced network's input order (s<i>, dense, l<j>; random embeddings,
    sequences zero past their lengths), with labels and weights."""
    sparse, dense, lengths = sample_batch(job.layout(), len(job.dense_fields), rows, seed)
    g = torch.Generator().manual_seed(seed)
    return ([*sparse.values(), dense, *lengths.values()],
            torch.randint(0, 2, (rows,), generator=g).float(), torch.rand(rows, generator=g))


def steps_equal_unpartitioned(job: Job, group: Group, steps: int = 3) -> None:
    """``steps`` training steps of the group and of the unpartitioned network from the same
    weights (the group's flat weights loaded in the network's own parameter order): the same
    loss, input gradients and parameter gradients, to 1e-5."""
    reference = traced_network(job)
    names = input_names(len(job.layout().fields), len(job.layout().sequence_fields))
    group.load(np.concatenate([p.detach().reshape(-1).numpy() for p in reference.parameters()]))
    ref_adam = torch.optim.Adam(reference.parameters(), lr=1e-3)
    for step in range(steps):
        inputs, labels, weights = job_inputs(job, step)
        float_in = [i for i, t in enumerate(inputs) if t.is_floating_point()]
        ref_in = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
        ref_loss = weighted_loss_sum(reference(*ref_in), labels, weights)
        reference.zero_grad()
        (ref_loss / weights.sum()).backward()
        ref_grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p))
                               .reshape(-1) for p in reference.parameters()])
        mp_in = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
        logits = group.forward(dict(zip(names, mp_in, strict=True)), train=True)
        leaf = logits.detach().requires_grad_(True)
        loss = weighted_loss_sum(leaf, labels, weights)
        (loss / weights.sum()).backward()
        group.backward(leaf.grad)
        assert float(loss.detach()) == pytest.approx(float(ref_loss.detach()), abs=1e-5)
        for i in float_in:
            assert torch.allclose(mp_in[i].grad, ref_in[i].grad, atol=1e-5), names[i]
        held = {**group.program.params, **group.member.program.params}
        grads = [(held[n].grad if held[n].grad is not None else torch.zeros_like(held[n]))
                 .reshape(-1) for n, _, _ in flat_layout(group.gm, group.program.owner)]
        assert torch.allclose(torch.cat(grads), ref_grads, atol=1e-5)
        ref_adam.step()
        group.replica.optimizer.step()
    assert np.allclose(group.flat(), np.concatenate(
        [p.detach().reshape(-1).numpy() for p in reference.parameters()]), atol=1e-5)
    assert group.member.steps == steps


@pytest.mark.parametrize("network", ["din", "dcn", "dlrm", "reordered"])
def test_a_two_part_step_of_a_planned_network_equals_the_unpartitioned_step(network, tmp_path):
    """Control's plan (plan_job, 2 parts) of din (a sequence and its int64 lengths), dcn and
    dlrm (26 fields, 13 dense) and of a user's module with bool masks and shapes."""
    job = {"din": lambda: items_job('network = "din"\nembedding_dim = 8\nhidden = [32, 16]'),
           "dcn": lambda: criteo_job("dcn"), "dlrm": lambda: criteo_job("dlrm"),
           "reordered": lambda: items_job('module = "net.py:build"\nembedding_dim = 8',
                                          tmp_path, REORDERED)}[network]()
    plan = plan_job(job)
    assert plan.nodes[1], "the plan leaves member 1 nothing to do"
    steps_equal_unpartitioned(job, Group(job, plan.owner))


def test_the_flat_weights_follow_the_networks_own_parameter_order(tmp_path):
    """A GraphModule orders parameters by first use and drops those no node uses; the group's
    flat weights are the network's ``parameters()`` (what the aggregator and data-parallel
    replicas use), whichever member holds each."""
    job = items_job('module = "net.py:build"\nembedding_dim = 8', tmp_path, REORDERED)
    gm = trace_job(job, 4)
    network = [f"net.{n}" for n, _ in build_network(job).named_parameters()]
    assert network[:3] == ["net.spare", "net.head.weight", "net.head.bias"]
    traced = [n for n, _ in gm.named_parameters()]
    assert traced != network and "net.spare" not in traced   # what the point is about
    owner = {n.name: int(n.name in {"net_body", "relu"}) for n in gm.graph.nodes}
    assert [n for n, _, _ in flat_layout(gm, owner)] == network
    group = Group(job, owner)
    assert list(group.member.program.params) == ["net.body.weight", "net.body.bias"]
    assert list(group.program.params) == [n for n in network if "body" not in n]
    reference = np.concatenate([p.detach().reshape(-1).numpy()
                                for p in build_network(job).parameters()])
    assert group.replica.size == reference.size
    assert np.array_equal(group.flat(), reference)   # the same seeded weights
    values = np.arange(group.replica.size, dtype=np.float32)
    group.load(values)
    assert np.array_equal(group.flat(), values)
    body = build_network(job)
    torch.nn.utils.vector_to_parameters(torch.from_numpy(values), body.parameters())
    assert torch.equal(group.member.program.params["net.body.weight"], body.body.weight)
    assert torch.equal(group.program.params["net.spare"], body.spare)


def test_weights_gather_and_scatter_over_the_group(group):
    values = np.arange(group.replica.size, dtype=np.float32) / group.replica.size
    group.load(values)
    assert np.array_equal(group.flat(), values)
    assert group.member.program.params  # the member holds some of them
    assert len(group.program.params) + len(group.member.program.params) == \
        len(list(traced_network(JOB).parameters()))
    assert np.array_equal(group.member.program.flat(),   # loaded into the member itself
                          values[group.leader.weights.slices[1]])


def test_the_members_weights_are_read_only_between_a_gather_and_a_scatter(group):
    """The replica's arithmetic reads the members' slices as they were gathered: not before
    a gather, not after the scatter (the members train on), and a slice of the wrong size
    is refused."""
    with pytest.raises(RuntimeError, match="before they were gathered"):
        group.replica.flat()
    group.exchange(group.leader.gather())
    assert group.leader.gathered()
    group.replica.flat()
    group.exchange(group.leader.scatter())
    assert group.leader.scattered()
    with pytest.raises(RuntimeError, match="before they were gathered"):
        group.replica.flat()
    with pytest.raises(ProtocolError):
        group.leader.weights.hold({1: np.zeros(3, dtype=np.float32)})


def test_scoring_runs_forward_only(group):
    emb, dense, _, _ = batch(9)
    reference = traced_network(JOB)
    with torch.no_grad():
        assert torch.allclose(group.forward(named(emb, dense), train=False),
                              reference(*emb, dense), atol=1e-5)
    assert group.member.steps == 0


def test_a_message_for_a_value_not_in_the_network_is_refused():
    gm = trace(traced_network(JOB), example_inputs(JOB, 4))
    server = MemberServer(Program(gm, split({"net_mlp_2"}), 1, torch.device("cpu")), lr=1e-3)
    bad = MemberTensors(step=1, phase="forward", train=True, names=["nope"], shapes=[[1]],
                        values=np.zeros(1, dtype=np.float32))
    with pytest.raises(ProtocolError):
        server.handle(bad)
    with pytest.raises(ProtocolError):
        server.handle(MemberReply(call="step", seq=1, values=np.zeros(0, np.float32)))


def test_a_plan_that_does_not_match_the_network_is_refused():
    gm = trace(traced_network(JOB), example_inputs(JOB, 4))
    owner = split({"net_mlp_2"})
    owner.pop("net_mlp_2")
    with pytest.raises(ValueError, match="does not match"):
        Program(gm, owner, 1, torch.device("cpu"))


def test_the_job_plan_pins_inputs_and_output_to_the_leader():
    plan = plan_job(JOB)
    assert plan.parts == 2
    assert all(plan.owner[f"s{i}"] == 0 for i in range(4)) and plan.owner["dense"] == 0
    assert plan.owner["output"] == 0
    assert set(plan.nodes[1])  # the other part has work
    assert plan.cut_critical >= 2  # out to part 1 and back: every chain edge is critical
    assert plan.bytes_per_step > 0
    assert sum(len(n) for n in plan.nodes) == len(plan.owner)


VARIANTS = {
    "no lists": '[data.synthetic]\nvocab = [10, 20, 30, 40]\ndense = 5\n',
    "pooled lists": '[data.synthetic]\nitems = 200\nhistory = 6\n',          # mean pooled
    "a sequence": ITEMS,                                                       # l0 lengths
}
PLANS = [(net, variant, parts) for net in ("mlp", "dlrm", "dcn", "deepfm", "wide_deep", "din")
         for variant in VARIANTS if net != "din" or variant == "a sequence"
         for parts in (2, 4)]


@pytest.mark.parametrize("network, variant, parts", PLANS)
def test_every_builtin_plans_with_inputs_and_output_on_the_leader_and_no_non_float_value_cut(
        network, variant, parts):
    job = parse_job(f'[data]\nsource = "synthetic"\n{VARIANTS[variant]}\n[model]\n'
                    f'network = "{network}"\nembedding_dim = 8\n[train]\nbatch_size = 64\n'
                    f'sync = "every"\n[cluster]\nparts = {parts}\n', environ={})
    plan = plan_job(job)
    gm = trace_job(job, 4)
    nodes = list(gm.graph.nodes)
    assert plan.parts == parts and set(plan.owner) == {n.name for n in nodes}
    assert set(plan.owner.values()) <= set(range(parts))
    assert sorted(n for part in plan.nodes for n in part) == sorted(plan.owner)
    ends = [n.name for n in nodes if n.op in ("placeholder", "output")]
    assert len(ends) == len(job.layout().fields) + 2 + len(job.layout().sequence_fields)
    assert all(plan.owner[n] == 0 for n in ends)
    if variant == "a sequence":
        assert not differentiable(gm.graph.find_nodes(op="placeholder", target="l0")[0])
    for node in nodes:
        if not differentiable(node):
            assert {plan.owner[u.name] for u in node.users} <= {plan.owner[node.name]}, node
    for member in range(parts):   # and every member's Program takes it
        Program(gm, plan.owner, member, torch.device("cpu"))


UNTRACEABLE = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.out = nn.Linear(width, 1)

    def forward(self, sparse, dense, lengths):
        x = torch.cat([*sparse.values(), dense], dim=1)
        if x.sum() > 0:
            x = x * 2
        return self.out(x).squeeze(1)


def build(sparse_dims, sequence_fields, dense_count, options):
    return Net(sum(sparse_dims.values()) + dense_count)
"""


def untraceable_job(where: Path) -> Job:
    (where / "net.py").write_text(UNTRACEABLE)
    text = ('name = "untraceable"\n[data]\nsource = "synthetic"\n[data.synthetic]\n'
            'rows = 1000\n[model]\nmodule = "net.py:build"\n[train]\nbatch_size = 32\n'
            'sync = "every"\n[cluster]\nparts = 2\n')
    (where / "job.toml").write_text(text)
    return parse_job(text, origin=str(where / "job.toml"), base_dir=where, environ={})


def untraceable_line(where: Path, parts: int) -> str:
    net = re.escape(str(where / "net.py"))
    return (rf"^\[model\] module {net} cannot be traced for \[cluster\] parts = {parts}: "
            r"TraceError: symbolically traced variables cannot be used as inputs to control "
            rf"flow \(at {net}:13\); run it with parts = 1$")


def test_a_network_fx_cannot_trace_is_one_line_saying_run_it_with_parts_1(tmp_path):
    from roles.model.parallel import member_program
    from roles.protocol.model_parallel import ModelPlan

    job = untraceable_job(tmp_path)
    build_network(job)   # it runs (parts = 1 trains it); only tracing fails
    with pytest.raises(NetworkError, match=untraceable_line(tmp_path, 2)):
        plan_job(job)
    with pytest.raises(NetworkError, match=untraceable_line(tmp_path, 4)):
        plan_job(job, 4)   # zbus-partition --parts 4
    with pytest.raises(NetworkError, match=untraceable_line(tmp_path, 2)):   # a member's
        member_program(job, ModelPlan(parts=2, owner={"s0": 0}, summary={}), 1,
                       torch.device("cpu"))


def test_a_failure_of_shape_propagation_is_the_same_line(monkeypatch):
    def fails(*_args):
        raise RuntimeError("ShapeProp error for: node=...") from ValueError("bad\nshape")

    monkeypatch.setattr("roles.model.graph.ShapeProp.propagate", fails)
    with pytest.raises(NetworkError, match=r"^\[model\] network din cannot be traced for "
                                           r"\[cluster\] parts = 2: ValueError: bad shape; run "
                                           r"it with parts = 1$"):
        trace_job(items_job('network = "din"'), 4)


def test_control_fails_the_job_at_start_with_that_line(tmp_path):
    from roles.control.model_plan import PlanError, plan_model
    from roles.job.rundir import MetricsLog

    job = untraceable_job(tmp_path)
    with pytest.raises(PlanError, match=r"cannot be traced for \[cluster\] parts = 2: "
                                        r"TraceError: .*; run it with parts = 1$"):
        plan_model(job, tmp_path, MetricsLog(tmp_path / "metrics.jsonl"))


@pytest.mark.inprocess
def test_control_fails_an_untraceable_job_at_start_with_that_line(cluster, tmp_path):
    untraceable_job(tmp_path)   # writes job.toml and net.py
    c = cluster(job=tmp_path / "job.toml")
    c.start_role("control")
    assert c.wait(timeout=60) == 1
    summary = c.summary()
    assert summary["status"] == "failed"
    assert re.match(untraceable_line(tmp_path, 2), summary["reason"]), summary["reason"]
    assert f"failed: {summary['reason']}" in c.log("control-0")   # the headline
    assert "waiting for" not in c.log("control-0")   # for nodes it will never take


def test_flops_of_the_traced_network():
    gm = trace(traced_network(JOB), example_inputs(JOB, 32))
    g = task_graph(gm)
    linear = dict(zip(g.names, g.cost, strict=True))
    assert linear["net_mlp_0"] == 2 * 32 * (4 * 8 + 5) * 64
    assert linear["net_mlp_2"] == 2 * 32 * 64 * 64
    assert linear["s0"] == 0


def test_plan_of_four_parts_balances_better_than_the_bound_or_says_so():
    gm = trace(traced_network(JOB), example_inputs(JOB, 32))
    plan = plan_graph(gm, PartitionSettings(parts=4), critical_bytes=1 << 20,
                      critical_path=True)
    assert plan.balanced == (plan.balance <= 1.2 + 1e-9)
    assert len(plan.load) == 4


@pytest.mark.parametrize("names, shapes, phase, kind", [
    (["cat"], [[3, 37]], "forward", "bad_field"),        # made here, not sent here
    (["net_mlp_1"], [[3, 99]], "forward", "bad_shape"),      # wrong width
    (["net_mlp_1"], [[3]], "forward", "bad_shape"),          # wrong rank
    (["net_mlp_4"], [[3, 32]], "backward", "bad_field"),     # a gradient of the leader's value
])
def test_tensors_that_do_not_fit_the_plan_are_refused(names, shapes, phase, kind):
    gm = trace(traced_network(JOB), example_inputs(JOB, 4))
    server = MemberServer(Program(gm, split({"net_mlp_2", "net_mlp_3"}), 1, torch.device("cpu")),
                          lr=1e-3)
    size = sum(int(np.prod(s)) for s in shapes)
    msg = MemberTensors(step=1, phase=phase, train=True, names=names, shapes=shapes,
                        values=np.zeros(size, dtype=np.float32))
    with pytest.raises(ProtocolError) as err:
        server.handle(msg)
    assert err.value.kind == kind
    assert not server.program.values  # nothing of a refused message was taken


def test_group_messages_are_checked_on_decoding():
    from roles.protocol.model_parallel import ModelPlan
    from zbus.codec import decode

    good = MemberTensors(step=1, phase="forward", train=True, names=["a", "b"],
                         shapes=[[2, 3], [4]], values=np.arange(10, dtype=np.float32))
    back = decode(good.to_frames("worker-0", 1)).msg
    assert [(n, a.shape) for n, a in back.tensors()] == [("a", (2, 3)), ("b", (4,))]
    for bad in (MemberTensors(step=1, phase="forward", train=True, names=["a"], shapes=[[2, 3]],
                              values=np.zeros(5, dtype=np.float32)),         # 6 values declared
                MemberTensors(step=1, phase="sideways", train=True, names=[], shapes=[],
                              values=np.zeros(0, dtype=np.float32)),
                MemberTensors(step=1, phase="forward", train=True, names=["a"], shapes=[[-1]],
                              values=np.zeros(0, dtype=np.float32)),
                ModelPlan(parts=2, owner={"x": 2}, summary={}),
                ModelPlan(parts=1, owner={}, summary={})):
        with pytest.raises(ProtocolError):
            decode(bad.to_frames("worker-0", 1))


@pytest.mark.inprocess
def test_the_partition_command_prints_the_plan(capsys, monkeypatch):
    """zbus-partition (its main, in this process)."""
    from harness import REPO

    from roles.tools import partition

    for name in [n for n in __import__("os").environ if n.startswith("ZBUS_")]:
        monkeypatch.delenv(name)
    partition.main(["--job", str(REPO / "jobs" / "adult_mp.toml"), "--parts", "3", "--json"])
    plan = __import__("orjson").loads(capsys.readouterr().out)
    assert plan["parts"] == 3 and len(plan["load"]) == 3
    assert set(plan["owner"].values()) <= {0, 1, 2}
    partition.main(["--job", str(REPO / "jobs" / "adult_mp.toml")])
    text = capsys.readouterr().out
    assert "cut critical edges" in text and "part" in text
    with pytest.raises(SystemExit) as bad:
        partition.main(["--parts", "99"])
    assert bad.value.code == 2 and "--parts" in capsys.readouterr().err


def test_model_parallelism_needs_a_sync_mode_with_local_steps():
    from roles.job.settings import JobError

    with pytest.raises(JobError, match="parts > 1"):
        parse_job('[data]\nsource = "synthetic"\n[train]\nsync = "step"\n[cluster]\nparts = 2\n')


# -- the worker's side: its loop waits, nothing blocks --------------------------------------------
class Linked:
    """The worker's link to its group (``GroupLink``) and member 1, the messages the link sends
    kept (``sent``) until the test carries them to the member, whose answers the link reads as
    its loop would (``heard``)."""

    def __init__(self, timeout_s: float = 5.0):
        from roles.model.parallel import member_program
        from roles.protocol.model_parallel import ModelPlan
        from roles.worker.group_link import GroupLink

        self.sent: list[tuple[str, Message]] = []
        self.failures: list[Exception] = []
        self.all_there = 0
        self.link = GroupLink(JOB, "worker-0", 0, torch.device("cpu"), {1: "to member 1"},
                              lambda sock, msg: self.sent.append((sock, msg)), timeout_s,
                              ping_every_s=1.0, all_there=self.there,
                              unexpected=lambda env, where: None, failed=self.failures.append)
        plan = ModelPlan(parts=2, owner=plan_job(JOB).owner, summary={})
        self.replica = self.link.take_plan(plan, now=0.0)
        self.member = MemberServer(member_program(JOB, plan, 1, torch.device("cpu"))[1], 1e-3)

    def there(self) -> None:
        self.all_there += 1

    def carry(self) -> None:
        """Every message sent to the member, and each of its answers to the link."""
        while self.sent:
            _, msg = self.sent.pop(0)
            for to, reply in self.member.handle(wire(msg)):
                assert to == 0
                self.link.heard(decode(reply.to_frames("member-0", 0)))


def test_the_leader_waits_for_its_members_through_the_workers_loop_not_in_it():
    """A batch over the group, and the replica's weights, are tasks: each returns at once,
    waiting (``busy``), and goes on as the loop hands the link the members' answers, in order;
    the members' pings are answered the same way."""
    g = Linked()
    assert [type(m).__name__ for _, m in g.sent] == ["MemberCall"]   # the plan's ping
    g.carry()
    assert g.all_there == 1 and not g.link.waiting()
    emb, dense, _, _ = batch(4)
    outputs, order = [], []

    def score():
        outputs.append((yield from g.link.forward(named(emb, dense), train=False)))
        order.append("scored")

    g.link.run(score())
    g.link.run(g.link.on_weights(lambda: order.append(g.replica.flat().size)))
    assert g.link.busy() and not outputs and not order   # sent its tensors; waits
    assert [type(m).__name__ for _, m in g.sent] == ["MemberTensors"]
    g.carry()
    assert not g.link.busy() and order == ["scored", g.replica.size]
    with torch.no_grad():
        assert torch.allclose(outputs[0], traced_network(JOB)(*emb, dense), atol=1e-5)
    assert not g.failures and g.link.counters()["group_steps"] == 1


def test_a_member_that_does_not_answer_fails_the_group_after_the_timeout():
    g = Linked(timeout_s=5.0)
    g.carry()
    emb, dense, _, _ = batch(4)
    g.link.run(g.link.forward(named(emb, dense), train=False))
    g.sent.clear()   # lost with the member
    g.link.tick(g.link.waiting_since + 4.0)
    assert not g.failures and g.link.busy()
    g.link.tick(g.link.waiting_since + 6.0)
    assert [str(e) for e in g.failures] == [
        "no answer from the group's parts within 5 s while running forward of step 1"]
    assert not g.link.busy()
