"""A network split over two members of a model-parallel group, over real ZeroMQ sockets on
loopback: a step gives the loss and gradients of the unpartitioned network (to 1e-5), and the
plans of the job's network."""

import threading

import numpy as np
import pytest
import torch
import zmq

from roles.job.settings import parse_job
from roles.model.graph import (
    example_inputs,
    plan_graph,
    plan_job,
    task_graph,
    trace,
    traced_network,
)
from roles.model.network import weighted_loss_sum
from roles.model.parallel import GroupLeader, GroupReplica, MemberServer, Program
from roles.model.partitioner import PartitionSettings
from roles.protocol.model_parallel import MemberReply, MemberTensors
from zbus import sockets
from zbus.codec import ProtocolError

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


class Member:
    """Member 1 of the group in a thread: its ROUTER inbox, its DEALER to the leader."""

    def __init__(self, ctx: zmq.Context, owner: dict[str, int], inbox: str, leader: str):
        gm = trace(traced_network(JOB), example_inputs(JOB, 4))
        self.server = MemberServer(Program(gm, owner, 1, torch.device("cpu")), lr=1e-3)
        self.inbox = sockets.bind(ctx, zmq.ROUTER, inbox)
        self.to_leader = sockets.connect(ctx, zmq.DEALER, leader, identity="member-0")
        self.traffic = sockets.Traffic()
        self.stop = threading.Event()
        self.errors: list[Exception] = []
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        try:
            while not self.stop.is_set():
                if not self.inbox.poll(50):
                    continue
                _, env = sockets.recv(self.inbox, router=True, traffic=self.traffic)
                for _, msg in self.server.handle(env.msg):
                    sockets.send(self.to_leader, msg, sender="member-0", seq=0,
                                 traffic=self.traffic)
        except Exception as exc:  # reported by the test
            self.errors.append(exc)
        finally:
            self.inbox.close(0)
            self.to_leader.close(0)


@pytest.fixture
def group(tmp_path):
    """(leader program, leader, member, full model) with the network cut in the middle."""
    ctx = zmq.Context()
    inbox, outbox = f"ipc://{tmp_path}/leader", f"ipc://{tmp_path}/member"
    owner = split({"net_mlp_2", "net_mlp_3", "net_mlp_4"})  # a cut out and a cut back
    member = Member(ctx, owner, outbox, inbox)
    leader_in = sockets.bind(ctx, zmq.ROUTER, inbox)
    to_member = sockets.connect(ctx, zmq.DEALER, outbox, identity="worker-0")
    traffic = sockets.Traffic()
    rejected: list[ProtocolError] = []
    gm = trace(traced_network(JOB), example_inputs(JOB, 4))
    program = Program(gm, owner, 0, torch.device("cpu"))
    leader = GroupLeader(program, leader_in, {1: to_member},
                         lambda sock, msg: sockets.send(sock, msg, sender="worker-0", seq=0,
                                                        traffic=traffic),
                         traffic, rejected.append, timeout_s=20)
    try:
        yield gm, program, leader, member, rejected
    finally:
        member.stop.set()
        member.thread.join(5)
        ctx.destroy(linger=0)
        assert not member.errors


def batch(seed: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four fields' embeddings [32, 8], the dense features, labels and weights."""
    g = torch.Generator().manual_seed(seed)
    return ([torch.randn(32, 8, generator=g) for _ in range(4)], torch.randn(32, 5, generator=g),
            torch.randint(0, 2, (32,), generator=g).float(), torch.rand(32, generator=g))


def named(emb: list[torch.Tensor], dense: torch.Tensor) -> dict[str, torch.Tensor]:
    """The inputs by the traced network's placeholder names."""
    return {**{f"s{i}": e for i, e in enumerate(emb)}, "dense": dense}


def test_a_two_part_step_equals_the_unpartitioned_step(group):
    gm, program, leader, member, rejected = group
    reference = traced_network(JOB)
    replica = GroupReplica(gm, program, leader, torch.device("cpu"), 1e-3)
    replica.load(np.concatenate([p.detach().reshape(-1).numpy()
                                 for p in reference.parameters()]))
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
        logits = leader.forward(named(mp_emb, dense), train=True)
        leaf = logits.detach().requires_grad_(True)
        loss = weighted_loss_sum(leaf, labels, weights)
        (loss / weights.sum()).backward()
        leader.backward(leaf.grad)
        assert float(loss.detach()) == pytest.approx(float(ref_loss.detach()), abs=1e-5)
        assert all(torch.allclose(m.grad, r.grad, atol=1e-5)
                   for m, r in zip(mp_emb, ref_emb, strict=True))
        own = {n: p.grad for n, p in program.params.items()}
        grads = []
        for name, _ in reference.named_parameters():
            got = own[name] if name in own else \
                member.server.program.params[name].grad
            grads.append(got.reshape(-1))
        assert torch.allclose(torch.cat(grads), ref_grads, atol=1e-5)
        ref_adam.step()
        replica.optimizer.step()  # the member stepped its own when its backward was done
    assert member.server.steps == 3
    assert not rejected


def test_weights_gather_and_scatter_over_the_group(group):
    gm, program, leader, member, _ = group
    replica = GroupReplica(gm, program, leader, torch.device("cpu"), 1e-3)
    values = np.arange(replica.size, dtype=np.float32) / replica.size
    replica.load(values)
    assert np.array_equal(replica.flat(), values)
    assert member.server.program.params  # the member holds some of them
    assert len(program.params) + len(member.server.program.params) == \
        len(list(traced_network(JOB).parameters()))


def test_scoring_runs_forward_only(group):
    _, program, leader, member, _ = group
    emb, dense, _, _ = batch(9)
    reference = traced_network(JOB)
    with torch.no_grad():
        out = leader.forward(named(emb, dense), train=False)
        assert torch.allclose(out, reference(*emb, dense), atol=1e-5)
    assert member.server.steps == 0


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


@pytest.mark.integration
def test_the_partition_command_prints_the_plan(tmp_path):
    import subprocess
    import sys

    from harness import REPO

    out = subprocess.run([sys.executable, "-m", "roles.tools.partition", "--job",
                          str(REPO / "jobs" / "adult_mp.toml"), "--parts", "3", "--json"],
                         capture_output=True, text=True, timeout=120, check=True)
    plan = __import__("orjson").loads(out.stdout)
    assert plan["parts"] == 3 and len(plan["load"]) == 3
    assert set(plan["owner"].values()) <= {0, 1, 2}
    text = subprocess.run([sys.executable, "-m", "roles.tools.partition", "--job",
                           str(REPO / "jobs" / "adult_mp.toml")],
                          capture_output=True, text=True, timeout=120, check=True).stdout
    assert "cut critical edges" in text and "part" in text
    bad = subprocess.run([sys.executable, "-m", "roles.tools.partition", "--parts", "99"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--parts" in bad.stderr


def test_model_parallelism_needs_a_sync_mode_with_local_steps():
    from roles.job.settings import JobError

    with pytest.raises(JobError, match="parts > 1"):
        parse_job('[data]\nsource = "synthetic"\n[train]\nsync = "step"\n[cluster]\nparts = 2\n')
