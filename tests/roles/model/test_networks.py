"""The network contract (roles/model/networks, docs/models.md): every built-in runs forward and
backward on the job's shapes, honours and checks its options, traces with torch.fx through
FlatInputs; ``mlp`` is the old CtrNet to the bit; a job of several labels gets a logit per label
(``[B, T]``), from a head per task on the single-task built-ins or from the multi-task ones; a
user's module is loaded by path or package, and each way it can be wrong is one NetworkError
line naming the file and the problem."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import REPO
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from roles.job.settings import NETWORKS, load_job, parse_job
from roles.model.network import bf16_is_native, build_network, network_logits
from roles.model.networks import (
    BUILTINS,
    FlatInputs,
    NetworkError,
    check_network,
    din,
    example_inputs,
    input_names,
    sample_batch,
)
from roles.model.networks.esmm import product_logit
from roles.model.networks.layers import JoinedFields, field_input
from roles.model.networks.registry import SEVERAL_LABELS
from roles.model.sparse_input import SparseInputs

ROOT = REPO   # the checkout

ITEMS = """
[data.synthetic]
items = 30
history = 6

[model.pooling]
history = "none"

[model.max_len]
history = 6
genres = 3
"""


class CtrNet(nn.Module):
    """The network zbus trained before list fields (embeddings [batch, fields, dim])."""

    def __init__(self, fields: int, embedding_dim: int, dense: int, hidden: list[int]):
        super().__init__()
        layers: list[nn.Module] = []
        width = fields * embedding_dim + dense
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, embeddings: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """embeddings [batch, fields, dim], dense [batch, dense] -> logits [batch]."""
        return self.mlp(torch.cat([embeddings.flatten(1), dense], dim=1)).squeeze(1)



def make_job(model: str = "", more: str = "", origin: Path | None = None, items: bool = True):
    text = f'[data]\nsource = "synthetic"\n{ITEMS if items else ""}\n{more}\n[model]\n{model}\n'
    if origin is None:
        return parse_job(text, environ={})
    origin.write_text(text)
    return parse_job(text, origin=str(origin), base_dir=origin.parent, environ={})


LABELS = """
[data]
source = "file"
path = "rows.csv"
labels = {labels}
dense = ["d0", "d1", "d2", "d3"]
sparse = ["c0", "c1", "item", "genres", "history"]
lists = {{ genres = "|", history = "|" }}
tables = {{ item = ["item", "history"] }}

[model]
{model}

[model.pooling]
history = "none"

[model.max_len]
history = 6
genres = 3
"""

ONE_LABEL = sorted(set(BUILTINS) - set(SEVERAL_LABELS))


def labels_job(model: str = "", labels: tuple[str, ...] = ("click", "buy")):
    """A job of several labels (read from files; none is read here), with a pooled list field
    (genres) and a sequence (history) beside single-valued fields."""
    names = ", ".join(f'"{n}"' for n in labels)
    return parse_job(LABELS.format(labels=f"[{names}]", model=model), environ={})


def job_of(network: str, options: str = ""):
    """The items job for a network of one label, a job of two labels for the others."""
    model = f'network = "{network}"' + (f"\n[model.options]\n{options}" if options else "")
    return labels_job(model) if network in SEVERAL_LABELS else make_job(model)


def inputs_of(job, rows: int = 4, seed: int = 0, grad: bool = False):
    sparse, dense, lengths = sample_batch(job.layout(), len(job.dense_fields), rows, seed)
    if grad:
        for t in sparse.values():
            t.requires_grad_(True)
    return sparse, dense, lengths


# -- the built-ins -----------------------------------------------------------------------------

def test_the_built_ins_are_the_networks_the_job_may_name():
    assert set(BUILTINS) == set(NETWORKS)


@pytest.mark.parametrize("network", sorted(BUILTINS))
def test_a_built_in_gives_logits_and_gradients_to_every_field_and_parameter(network):
    job = job_of(network)
    net = build_network(job)
    sparse, dense, lengths = inputs_of(job, rows=5, grad=True)
    out = net(sparse, dense, lengths)
    assert out.shape == ((5,) if len(job.tasks) == 1 else (5, 2))
    assert out.dtype == torch.float32
    out.sum().backward()
    assert job.layout().sequence_fields == ["history"]
    for f, t in sparse.items():
        assert t.grad is not None and t.grad.abs().sum() > 0, f"{network}: no gradient to {f}"
    for name, p in net.named_parameters():
        assert p.grad is not None, f"{network}: no gradient to {name}"


@pytest.mark.parametrize("network", sorted(BUILTINS))
def test_a_built_in_under_bf16_gives_float32_logits_and_gradients_near_fp32s(network):
    """``[train] precision = "bf16"`` (``network_logits``): the forward under autocast, the
    logits and every gradient leaving the network float32, within bfloat16's precision of the
    fp32 figures (three significant digits)."""
    job = job_of(network)
    net = build_network(job)
    got = {}
    for precision in ("fp32", "bf16"):
        sparse, dense, lengths = inputs_of(job, rows=64, grad=True)
        net.zero_grad(set_to_none=True)
        out = network_logits(net, sparse, dense, lengths, precision)
        out.sum().backward()
        got[precision] = (out.detach(), {f: t.grad for f, t in sparse.items()},
                          {n: p.grad for n, p in net.named_parameters()})
    (out32, sparse32, params32), (out16, sparse16, params16) = got["fp32"], got["bf16"]
    assert out16.dtype == torch.float32 and out16.shape == out32.shape
    assert not torch.equal(out16, out32)          # bfloat16 arithmetic did happen
    torch.testing.assert_close(out16, out32, atol=0.05, rtol=0.05)
    for f, g in sparse16.items():
        assert g is not None and g.dtype == torch.float32 and torch.isfinite(g).all(), f
        assert g.abs().sum() > 0, f"{network}: no gradient to {f}"
        assert torch.nn.functional.cosine_similarity(g.flatten(), sparse32[f].flatten(),
                                                     dim=0) > 0.95, f
    for name, g in params16.items():
        assert g is not None and g.dtype == torch.float32, name
        assert torch.isfinite(g).all(), name
    flat16, flat32 = (torch.cat([g.flatten() for g in p.values()]) for p in (params16, params32))
    assert torch.nn.functional.cosine_similarity(flat16, flat32, dim=0) > 0.95


def test_bf16_is_native_answers_for_the_cpu():
    assert isinstance(bf16_is_native(torch.device("cpu")), bool)


@pytest.mark.parametrize("network", sorted(BUILTINS))
def test_a_built_in_refuses_an_option_it_does_not_know(network):
    job = job_of(network, "bogus = 1")
    with pytest.raises(NetworkError, match=rf"^{network}: unknown option 'bogus' .*knows .*hidden"):
        build_network(job)


def test_the_options_are_honoured():
    dcn = build_network(make_job('network = "dcn"\nhidden = [7]\n[model.options]\n'
                                 'cross_layers = 2\nstructure = "stacked"'))
    assert len(dcn.cross) == 2 and dcn.out.in_features == 7
    parallel = build_network(make_job('network = "dcn"\n[model.options]\ncross_layers = 0'))
    assert len(parallel.cross) == 0
    assert parallel.out.in_features == (11 * 16 + 4) + 64   # x0 beside the deep tower
    mlp = build_network(make_job("hidden = [9, 5]"))
    assert [m.out_features for m in mlp.mlp if isinstance(m, torch.nn.Linear)] == [9, 5, 1]
    dlrm = build_network(make_job('network = "dlrm"\n[model.options]\nbottom = [8, 16]'))
    assert [m.out_features for m in dlrm.bottom if isinstance(m, torch.nn.Linear)] == [8, 16]
    din = build_network(make_job('network = "din"\n[model.options]\nattention_hidden = [8, 4]\n'
                                 'candidate = "c3"'))
    assert [m.out_features for m in din.attention if isinstance(m, torch.nn.Linear)] == [8, 4, 1]
    assert din.candidate == "c3" and din.sequence == "history"


@pytest.mark.parametrize("options, message", [
    ("structure = \"sideways\"", "dcn: option structure must be one of 'parallel', 'stacked'"),
    ("cross_layers = -1", "dcn: option cross_layers must be an integer >= 0, got -1"),
    ("hidden = [0]", "dcn: option hidden must be a list of layer sizes >= 1, got [0]"),
])
def test_a_bad_option_value_is_refused_by_name(options, message):
    with pytest.raises(NetworkError, match=re.escape(message)):
        build_network(make_job(f'network = "dcn"\n[model.options]\n{options}'))


@pytest.mark.parametrize("network", ["dlrm", "deepfm"])
def test_dlrm_and_deepfm_need_one_width(network):
    job = make_job(f'network = "{network}"\n[model.dims]\nitem = 8')
    with pytest.raises(NetworkError, match=rf"^{network} needs one embedding width for every "
                                           r"table, got 8: item, history; 16: c0, "):
        build_network(job)


def test_dlrm_interacts_every_pair_of_vectors_once():
    job = make_job('network = "dlrm"')
    net = build_network(job)
    sparse, dense, lengths = inputs_of(job, rows=5)
    bottom = net.bottom(dense)
    vectors = [bottom] + [sparse[f] if f != "history" else
                          sparse[f].sum(1) / lengths[f].clamp(min=1).unsqueeze(1)
                          for f in job.sparse_fields]
    t = torch.stack(vectors, dim=1)
    dots = t @ t.transpose(1, 2)
    i, j = torch.tril_indices(len(vectors), len(vectors), -1)
    expected = net.top(torch.cat([bottom, dots[:, i, j]], dim=1)).squeeze(1)
    assert torch.allclose(net(sparse, dense, lengths), expected, atol=1e-6)


def test_dlrm_bottom_must_end_with_the_width():
    with pytest.raises(NetworkError, match=r"dlrm: option bottom must end with the embedding "
                                           r"width 16, got \[8\]"):
        build_network(make_job('network = "dlrm"\n[model.options]\nbottom = [8]'))


def test_din_needs_a_sequence_field_and_a_candidate_of_its_width():
    with pytest.raises(NetworkError, match=re.escape(
            'din needs a sequence field ([model.pooling] <field> = "none")')):
        build_network(make_job('network = "din"', items=False))
    with pytest.raises(NetworkError, match=r"din: the candidate c0 \(width 4\) and the "
                                           r"sequence history \(width 16\) need one width"):
        build_network(make_job('network = "din"\n[model.dims]\nc0 = 4\n'
                               '[model.options]\ncandidate = "c0"'))
    # by default the candidate is the single-valued field sharing the sequence's table
    assert build_network(make_job('network = "din"\n[model.dims]\nc0 = 4')).candidate == "item"
    with pytest.raises(NetworkError, match=r"din: option candidate must name a single-valued "
                                           r"or pooled field \(c0, .*\), got 'history'"):
        build_network(make_job('network = "din"\n[model.options]\ncandidate = "history"'))


@pytest.mark.parametrize("network", ["din", "mlp", "dcn"])
def test_what_lies_past_a_sequence_length_changes_nothing(network):
    job = make_job(f'network = "{network}"')
    net = build_network(job)
    sparse, dense, lengths = inputs_of(job, rows=8)
    before = net(sparse, dense, lengths)
    history, n = sparse["history"].clone(), lengths["history"]
    past = torch.arange(history.shape[1]).unsqueeze(0) >= n.unsqueeze(1)
    assert past.any() and (~past).any()
    noisy = dict(sparse, history=torch.where(past.unsqueeze(2), torch.randn_like(history) * 9,
                                             history))
    assert torch.equal(net(noisy, dense, lengths), before)
    inside = dict(sparse, history=history + 1.0 * (~past).unsqueeze(2))
    assert not torch.equal(net(inside, dense, lengths), before)


def test_an_empty_sequence_pools_to_zero():
    job = make_job()
    net = build_network(job)
    sparse, dense, lengths = inputs_of(job, rows=1)   # row 0 has length 0
    assert lengths["history"].tolist() == [0]
    zeroed = dict(sparse, history=torch.zeros_like(sparse["history"]))
    assert torch.equal(net(sparse, dense, lengths), net(zeroed, dense, lengths))


def test_mlp_is_ctrnet_to_the_bit_for_a_job_without_lists():
    job = make_job(items=False)   # the default job's layers, [128, 64]
    layout = job.layout()
    assert layout.sequence_fields == [] and len(set(layout.dims)) == 1
    net = build_network(job)
    torch.manual_seed(job.train.seed)
    old = CtrNet(len(job.sparse_fields), job.model.embedding_dim, len(job.dense_fields),
                 job.model.hidden)
    new_params, old_params = list(net.named_parameters()), list(old.named_parameters())
    assert [n for n, _ in new_params] == [n for n, _ in old_params]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(new_params, old_params, strict=True))
    sparse, dense, lengths = inputs_of(job, rows=16, seed=3)
    embeddings = torch.stack([sparse[f] for f in job.sparse_fields], dim=1)
    assert torch.equal(net(sparse, dense, lengths), old(embeddings, dense))


def test_mlp_reads_the_joined_fields_as_it_reads_the_dict():
    """A worker's ``JoinedFields`` (the grid sample by sample, every field a view of it): the
    same logits and gradients as from a plain dict of copies, to float32 rounding (the joined
    path sums the first layer's product in two parts, ``mlp_over``)."""
    job = make_job(items=False)
    layout = job.layout()
    net = build_network(job)
    sparse, dense, lengths = inputs_of(job, rows=16, seed=5)
    flat = torch.stack([sparse[f] for f in layout.fields], dim=1).reshape(-1, layout.row_dim)
    joined_flat = flat.clone().requires_grad_(True)
    joined, _ = SparseInputs(layout, torch.device("cpu")).inputs(joined_flat, 16,
                                                                 np.zeros((16, 0), np.int32))
    assert isinstance(joined, JoinedFields)
    plain = {f: t.clone().requires_grad_(True) for f, t in sparse.items()}
    a, b = net(joined, dense, lengths), net(plain, dense, lengths)

    def same(x: torch.Tensor, y: torch.Tensor) -> bool:
        return torch.allclose(x, y, rtol=1e-5, atol=1e-6 * float(y.abs().max().clamp(min=1)))

    assert same(a, b) and not torch.equal(a, net(plain, dense + 1.0, lengths))
    a.sum().backward()
    grads_a = [p.grad.clone() for p in net.parameters()]
    net.zero_grad(set_to_none=True)
    b.sum().backward()
    assert all(same(g, p.grad) for g, p in zip(grads_a, net.parameters(), strict=True))
    by_field = torch.stack([plain[f].grad for f in layout.fields], dim=1).reshape(flat.shape)
    assert same(joined_flat.grad, by_field)
    with torch.no_grad():   # and evaluation, where the ReLUs overwrite their input
        assert torch.equal(net(joined, dense, lengths), a.detach())


def test_building_is_seeded_and_leaves_the_random_state_as_seeding_does():
    job = make_job('network = "din"')
    a, b = build_network(job), build_network(job)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    after_build = torch.rand(3)
    torch.manual_seed(job.train.seed)
    din.build(job.layout().sparse_dims(), job.layout().sequence_fields, 4,
              {"hidden": job.model.hidden})
    assert torch.equal(torch.rand(3), after_build)   # the sample batch drew nothing global


# -- tracing -----------------------------------------------------------------------------------

@pytest.mark.parametrize("network", ONE_LABEL)
def test_flat_inputs_trace_every_built_in(network):
    job = make_job(f'network = "{network}"')
    layout, dense_count = job.layout(), len(job.dense_fields)
    net = build_network(job)
    flat = FlatInputs(net, layout.fields, layout.sequence_fields)
    assert isinstance(flat, FlatInputs)
    assert [n for n, _ in flat.named_parameters()] == [f"net.{n}" for n, _ in
                                                       net.named_parameters()]
    gm = fx.symbolic_trace(flat)
    ShapeProp(gm).propagate(*example_inputs(layout, dense_count, 2))
    not_tensors = [n.name for n in gm.graph.nodes if n.op != "output"
                   and not hasattr(n.meta.get("tensor_meta"), "shape")]
    assert not not_tensors, f"values a cut between members could not carry: {not_tensors}"
    integers = [n.name for n in gm.graph.nodes if n.op != "output"
                and not n.meta["tensor_meta"].dtype.is_floating_point]
    assert integers == ["l0"], f"integer values besides the lengths: {integers}"
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    assert placeholders == input_names(len(layout.fields), 1)
    assert placeholders[-2:] == ["dense", "l0"] and placeholders[0] == "s0"
    assert [n for n, _ in gm.named_parameters()] == [f"net.{n}" for n, _ in
                                                     net.named_parameters()]
    sparse, dense, lengths = inputs_of(job, rows=6, seed=5)
    args = (*(sparse[f] for f in layout.fields), dense, lengths["history"])
    assert torch.equal(gm(*args), net(sparse, dense, lengths))
    example = example_inputs(layout, dense_count, 3)
    assert len(example) == len(placeholders) and gm(*example).shape == (3,)
    assert example[-1].tolist() == [6, 6, 6] and example[layout.fields.index("history")].shape \
        == (3, 6, 16)


def test_flat_inputs_without_sequence_fields_trace_too():
    job = make_job(items=False)
    net = build_network(job)
    gm = fx.symbolic_trace(FlatInputs(net, job.sparse_fields, []))
    assert [n.name for n in gm.graph.nodes if n.op == "placeholder"] == \
        [f"s{i}" for i in range(8)] + ["dense"]
    example = example_inputs(job.layout(), 4, 2)
    assert torch.equal(gm(*example), FlatInputs(net, job.sparse_fields, [])(*example))


# -- several labels ----------------------------------------------------------------------------

@pytest.mark.parametrize("network", ONE_LABEL)
def test_a_single_task_built_in_gives_a_head_per_label(network):
    """``tasks``: the same shared network, its last linear one logit wide per label; without
    it, the very parameters of before (names and shapes)."""
    one = build_network(labels_job(f'network = "{network}"', ("click",)))
    job = labels_job(f'network = "{network}"', ("click", "buy", "view"))
    net = build_network(job)
    sparse, dense, lengths = inputs_of(job, rows=5, grad=True)
    out = net(sparse, dense, lengths)
    assert out.shape == (5, 3) and torch.isfinite(out).all()
    out[:, 2].sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in sparse.values())
    widened = {n: p.shape for n, p in net.named_parameters()}
    before = {n: p.shape for n, p in one.named_parameters()}
    assert list(widened) == list(before)   # the same layers, in the same order
    changed = sorted(n for n in widened if widened[n][0] != before[n][0])
    assert changed and all(widened[n][0] == 3 and before[n][0] == 1 for n in changed)


def test_deepfm_adds_its_second_order_term_to_every_label():
    job = labels_job('network = "deepfm"')
    net = build_network(job)
    sparse, dense, lengths = inputs_of(job, rows=6)
    deep = net.deep(field_input(sparse, dense, lengths, net.fields, net.sequences))
    second = net(sparse, dense, lengths) - net.first(sparse, dense) - deep
    assert second.shape == (6, 2)
    torch.testing.assert_close(second[:, 0], second[:, 1])


@pytest.mark.parametrize("network, labels", [
    ("wide_deep", ("click",)), ("wide_deep", ("click", "buy")), ("deepfm", ("click",)),
    ("deepfm", ("click", "buy")),
])
def test_the_wide_part_and_the_first_order_are_a_weight_per_id_as_published(network, labels):
    """Cheng et al.'s wide part and Guo et al.'s first order: the sum of one weight per id (and
    per crossed pair), a weight per dense feature and a bias; not a linear of the vectors."""
    crosses = '\n[model.options]\ncrosses = [["c0", "c1"]]' if network == "wide_deep" else ""
    job = labels_job(f'network = "{network}"{crosses}', labels)
    layout, tasks = job.layout(), len(labels)
    net = build_network(job)
    linear = net.wide if network == "wide_deep" else net.first
    wide = layout.derived_fields
    assert wide == [f"wide:{f}" for f in job.sparse_fields] + (
        ["cross:c0*c1"] if network == "wide_deep" else [])
    assert linear.fields == wide and linear.dense.in_features == len(job.dense_fields)
    assert net.fields == job.sparse_fields   # the deep part reads the vectors, not the weights
    sparse, dense, lengths = inputs_of(job, rows=5, grad=True)
    assert all(sparse[f].shape == (5, tasks) for f in wide)   # a weight per task (pooled)
    with torch.no_grad():   # the deep part silenced: what is left is the linear model
        net.deep[-1].weight.zero_()
        net.deep[-1].bias.zero_()
    out = net(sparse, dense, lengths)
    expected = dense @ linear.dense.weight.T + linear.dense.bias + sum(sparse[f] for f in wide)
    if network == "deepfm":   # and the second order, from the vectors alone
        stacked = torch.stack([sparse[f] if f != "history" else
                               sparse[f].sum(1) / lengths[f].clamp(min=1).unsqueeze(1)
                               for f in net.fields], dim=1)
        expected = expected + 0.5 * (stacked.sum(1).pow(2) - stacked.pow(2).sum(1)).sum(
            1, keepdim=True)
    torch.testing.assert_close(out, expected.squeeze(1) if tasks == 1 else expected)
    out.sum().backward()
    for f in wide:   # every weight per id is trained: its gradient is the loss's, one per task
        assert sparse[f].grad is not None
        torch.testing.assert_close(sparse[f].grad, torch.ones(5, tasks))


@pytest.mark.parametrize("network, labels", [
    ("shared_bottom", 2), ("shared_bottom", 3), ("mmoe", 2), ("mmoe", 3), ("ple", 2),
    ("ple", 3), ("esmm", 2),
])
def test_a_multi_task_network_gives_a_column_per_label(network, labels):
    job = labels_job(f'network = "{network}"', tuple(f"l{i}" for i in range(labels)))
    net = build_network(job)
    sparse, dense, lengths = inputs_of(job, rows=7, seed=2, grad=True)
    assert set(lengths) == {"history"} and sparse["genres"].shape == (7, 16)
    out = net(sparse, dense, lengths)
    assert out.shape == (7, labels) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    out.sum().backward()
    for f, t in sparse.items():
        assert t.grad is not None and t.grad.abs().sum() > 0, f"{network}: no gradient to {f}"
    for name, p in net.named_parameters():
        assert p.grad is not None, f"{network}: no gradient to {name}"
    layout = job.layout()   # no branching on tensor values: torch.fx traces it
    gm = fx.symbolic_trace(FlatInputs(net, layout.fields, layout.sequence_fields))
    args = (*(sparse[f] for f in layout.fields), dense, lengths["history"])
    assert torch.equal(gm(*args), out)


@pytest.mark.parametrize("network", sorted(SEVERAL_LABELS))
def test_a_multi_task_network_refuses_one_label(network):
    with pytest.raises(NetworkError, match=rf"^{network} trains several labels: set \[data\] "
                                           r"labels$"):
        build_network(make_job(f'network = "{network}"'))


def test_the_multi_task_options_are_honoured():
    sb = build_network(labels_job('network = "shared_bottom"\n[model.options]\n'
                                  'bottom = [12, 10]\ntower = [6]'))
    assert [m.out_features for m in sb.bottom if isinstance(m, nn.Linear)] == [12, 10]
    assert [[m.out_features for m in t if isinstance(m, nn.Linear)] for t in sb.towers] == \
        [[6, 1], [6, 1]]
    mmoe = build_network(labels_job('network = "mmoe"\n[model.options]\nexperts = 3\n'
                                    'expert = [8]\ntower = []', ("a", "b", "c")))
    assert len(mmoe.experts) == 3 and [g.out_features for g in mmoe.gates] == [3, 3, 3]
    assert [t[0].in_features for t in mmoe.towers] == [8, 8, 8]
    ple = build_network(labels_job('network = "ple"\n[model.options]\nlevels = 3\n'
                                   'shared_experts = 1\ntask_experts = 2\nexpert = [8, 4]',
                                   ("a", "b", "c")))
    assert [level.shared_gate is None for level in ple.levels] == [False, False, True]
    first = ple.levels[0]
    assert len(first.task_experts) == 6 and len(first.shared_experts) == 1
    assert [g.out_features for g in first.task_gates] == [3, 3, 3]
    assert first.shared_gate.out_features == 7 and ple.levels[1].task_gates[0].in_features == 4


@pytest.mark.parametrize("network, options, message", [
    ("mmoe", "experts = 0", "mmoe: option experts must be an integer >= 1, got 0"),
    ("mmoe", "expert = []", "mmoe: option expert must name at least one layer, got []"),
    ("ple", "levels = 0", "ple: option levels must be an integer >= 1, got 0"),
    ("ple", "task_experts = 0", "ple: option task_experts must be an integer >= 1, got 0"),
    ("shared_bottom", "tower = [0]",
     "shared_bottom: option tower must be a list of layer sizes >= 1, got [0]"),
    ("esmm", 'chain = ["click", "view"]', "esmm: option chain must name the click's label then "
     "the conversion's, a permutation of ['click', 'buy'], got ['click', 'view']"),
    ("esmm", 'tower = [-1]', "esmm: option tower must be a list of layer sizes >= 1, got [-1]"),
])
def test_a_bad_multi_task_option_is_refused_by_name(network, options, message):
    with pytest.raises(NetworkError, match="^" + re.escape(message) + "$"):
        build_network(job_of(network, options))


def test_esmm_takes_exactly_two_labels():
    with pytest.raises(NetworkError, match=r"^esmm trains exactly two labels \(a click, then a "
                                           r"conversion\), got 3: a, b, c$"):
        build_network(labels_job('network = "esmm"', ("a", "b", "c")))


@pytest.mark.parametrize("chain", [None, ["buy", "click"]])
def test_esmm_gives_pctr_and_pctcvr_in_the_columns_of_its_chain(chain):
    options = "" if chain is None else f'\n[model.options]\nchain = ["{chain[0]}", "{chain[1]}"]'
    job = labels_job('network = "esmm"' + options)
    net = build_network(job)
    sparse, dense, lengths = inputs_of(job, rows=9, seed=4)
    out = net(sparse, dense, lengths)
    x = field_input(sparse, dense, lengths, net.fields, net.sequences)
    ctr, cvr = net.ctr(x).squeeze(1), net.cvr(x).squeeze(1)
    click, ctcvr = (0, 1) if chain is None else (1, 0)
    assert torch.equal(out[:, click], ctr)
    torch.testing.assert_close(torch.sigmoid(out[:, ctcvr]),
                               torch.sigmoid(ctr) * torch.sigmoid(cvr), atol=1e-6, rtol=0)


def test_esmm_product_logit_is_finite_and_exact_for_extreme_logits():
    values = torch.tensor([-1e4, -200.0, -90.0, -30.0, -3.0, 0.0, 0.5, 3.0, 30.0, 90.0, 200.0,
                           1e4])
    a, b = (t.flatten().clone().requires_grad_(True) for t in torch.meshgrid(values, values,
                                                                              indexing="ij"))
    logit = product_logit(a, b)
    assert torch.isfinite(logit).all()
    expected = torch.sigmoid(a.double()) * torch.sigmoid(b.double())
    torch.testing.assert_close(torch.sigmoid(logit.double()), expected, atol=1e-6, rtol=0)
    logit.sum().backward()
    assert torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()
    assert logit.max() < 90 and logit.min() <= -2e4   # p rounds to 1: the clamp; to 0: exact


def test_check_network_wants_a_column_per_label():
    layout = make_job(items=False).layout()

    class Net(nn.Module):
        def __init__(self, width: int):
            super().__init__()
            self.linear = nn.Linear(4, width)

        def forward(self, sparse, dense, lengths):
            out = self.linear(dense)
            return out.squeeze(1) if out.shape[1] == 1 else out

    check_network(Net(1), layout, 4, "one")
    check_network(Net(2), layout, 4, "two", tasks=2)
    with pytest.raises(NetworkError, match=re.escape(
            "one: forward returns shape [4] for a batch of 4 and 2 labels; return logits of "
            "shape [batch, 2] (a column per label of [data] labels, in order)")):
        check_network(Net(1), layout, 4, "one", tasks=2)
    with pytest.raises(NetworkError, match=re.escape(
            "two: forward returns shape [4, 2] for a batch of 4; return logits of shape "
            "[batch]")):
        check_network(Net(2), layout, 4, "two")
    with pytest.raises(NetworkError, match=r"shape \[4, 3\] for a batch of 4 and 2 labels"):
        check_network(Net(3), layout, 4, "three", tasks=2)


def test_a_users_module_gets_the_labels_in_its_options(tmp_path):
    (tmp_path / "net.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        SEEN = {}

        class Net(nn.Module):
            def __init__(self, dense_count, tasks):
                super().__init__()
                self.linear = nn.Linear(dense_count, tasks)

            def forward(self, sparse, dense, lengths):
                return self.linear(dense)

        def build(sparse_dims, sequence_fields, dense_count, options):
            SEEN.update(options)
            return Net(dense_count, len(options.get("tasks", ["one"])))
    """))
    model = 'module = "net.py:build"\n[model.options]\nwidth = 3'
    text = LABELS.format(labels='["click", "buy", "view"]', model=model)
    (tmp_path / "job.toml").write_text(text)
    job = parse_job(text, origin=str(tmp_path / "job.toml"), base_dir=tmp_path, environ={})
    net = build_network(job)
    assert sys.modules[type(net).__module__].SEEN == {
        "hidden": [128, 64], "width": 3, "tasks": ["click", "buy", "view"]}
    one = make_job('module = "net.py:build"', origin=tmp_path / "one.toml", items=False)
    with pytest.raises(NetworkError, match=r"returns shape \[4, 1\] .*\(e\.g\. \.squeeze\(1\)\)$"):
        build_network(one)   # no "tasks" for one label


# -- a user's module ---------------------------------------------------------------------------

GOOD = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, sparse_dims, dense_count):
        super().__init__()
        self.fields = list(sparse_dims)
        self.linear = nn.Linear(sum(sparse_dims.values()) + dense_count, 1)

    def forward(self, sparse, dense, lengths):
        return self.linear(torch.cat([sparse[f] for f in self.fields] + [dense], 1)).squeeze(1)


SEEN = {}


def build(sparse_dims, sequence_fields, dense_count, options):
    SEEN.update(dims=sparse_dims, sequences=sequence_fields, dense=dense_count, options=options)
    return Net(sparse_dims, dense_count)
"""


def user_job(tmp_path: Path, body: str, spec: str = "net.py:build", items: bool = False):
    (tmp_path / "net.py").write_text(textwrap.dedent(body))
    return make_job(f'module = "{spec}"', origin=tmp_path / "job.toml", items=items)


def test_a_good_module_gets_the_fields_in_order_and_the_options(tmp_path):
    job = make_job('module = "net.py:build"\nhidden = [5]\n[model.options]\nwidth = 3',
                   origin=tmp_path / "job.toml", items=False)
    (tmp_path / "net.py").write_text(GOOD)
    net = build_network(job)
    module = type(net).__module__
    seen = sys.modules[module].SEEN
    assert list(seen["dims"]) == job.sparse_fields and seen["dense"] == 4
    assert seen["sequences"] == [] and seen["options"] == {"hidden": [5], "width": 3}


def test_any_network_may_have_the_weights_per_id_and_a_users_module_gets_them(tmp_path):
    """``[model] weights_per_id``: a user's module gets the weights' fields after the data's
    (``wide:<f>``, one wide, and the crosses of its options, which it gets too); a built-in
    other than wide_deep and deepfm reads them as fields; deepfm refuses crosses."""
    job = make_job('module = "net.py:build"\nweights_per_id = true\n[model.options]\n'
                   'crosses = [["c0", "c1"]]', origin=tmp_path / "job.toml", items=False)
    (tmp_path / "net.py").write_text(GOOD)
    seen = sys.modules[type(build_network(job)).__module__].SEEN
    data = job.sparse_fields
    assert list(seen["dims"]) == data + [f"wide:{f}" for f in data] + ["cross:c0*c1"]
    assert all(seen["dims"][f] == 1 for f in list(seen["dims"])[len(data):])
    assert seen["options"]["crosses"] == [["c0", "c1"]]
    mlp = build_network(make_job('network = "mlp"\nweights_per_id = true\n[model.options]\n'
                                 'crosses = [["c0", "c1"]]', items=False))
    first = next(m for m in mlp.modules() if isinstance(m, nn.Linear))
    assert first.in_features == 16 * len(data) + len(data) + 1 + 4   # vectors, weights, dense
    with pytest.raises(NetworkError, match="deepfm: unknown option 'crosses'"):
        build_network(make_job('network = "deepfm"\n[model.options]\ncrosses = [["c0", "c1"]]',
                               items=False))
    plain = make_job('network = "mlp"', items=False)
    assert plain.layout().derived_fields == []


def test_the_docs_example_module_runs_on_a_sequence_job(tmp_path):
    text = (ROOT / "docs" / "models.md").read_text()
    example = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "tiny.py").write_text(example)
    job = make_job('module = "nets/tiny.py:build"\n[model.options]\nwidth = 8',
                   origin=tmp_path / "job.toml")
    net = build_network(job)
    sparse, dense, lengths = inputs_of(job)
    assert net(sparse, dense, lengths).shape == (4,)
    fx.symbolic_trace(FlatInputs(net, job.layout().fields, job.layout().sequence_fields))


def test_a_module_outside_the_repository_by_a_path_relative_to_the_job_file(
        tmp_path, monkeypatch):
    (tmp_path / "nets").mkdir()
    (tmp_path / "jobs").mkdir()
    (tmp_path / "nets" / "mine.py").write_text(GOOD)
    job_file = tmp_path / "jobs" / "job.toml"
    job_file.write_text('[data]\nsource = "synthetic"\n[model]\n'
                        'module = "../nets/mine.py:build"\n')
    monkeypatch.chdir(ROOT)
    job = load_job(str(job_file), environ={})
    assert not (ROOT / "nets" / "mine.py").exists()
    assert build_network(job).linear.in_features == 8 * 16 + 4


def test_a_package_module_by_its_dotted_name(tmp_path, monkeypatch):
    package = tmp_path / "zbus_test_nets_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mine.py").write_text(GOOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    job = make_job('module = "zbus_test_nets_pkg.mine:build"', items=False)
    assert build_network(job).linear.out_features == 1
    job = make_job('module = "zbus_test_nets_pkg.mine:nothing"', items=False)
    with pytest.raises(NetworkError, match=r"zbus_test_nets_pkg\.mine:nothing \(.*mine\.py\): "
                                           r"no factory 'nothing' in it \(it defines Net, build"):
        build_network(job)
    (package / "broken.py").write_text("from . import helper\n")
    (package / "helper.py").write_text("\nraise OSError('no weights file')\n")
    job = make_job('module = "zbus_test_nets_pkg.broken:build"', items=False)
    with pytest.raises(NetworkError, match=r"zbus_test_nets_pkg\.broken:build': cannot import "
                                           r"it: OSError: no weights file \(at .*helper\.py:2\)$"):
        build_network(job)
    job = make_job('module = "zbus_test_nets_pkg.absent:build"', items=False)
    with pytest.raises(NetworkError, match=r"no module named 'zbus_test_nets_pkg\.absent' on "
                                           r"sys\.path"):
        build_network(job)


FORWARD = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, sparse, dense, lengths):
        {body}


def build(sparse_dims, sequence_fields, dense_count, options):
    return Net()
"""

BAD = {
    "syntax error": ("def build(:\n    pass\n",
                     r"cannot import it: SyntaxError: .* \(at {file}:1\)$"),
    "import error inside": ("import os\nimport zbus_no_such_package_here\n",
                            r"cannot import it: ModuleNotFoundError: No module named "
                            r"'zbus_no_such_package_here' \(at {file}:2\)$"),
    "no factory": ("def other(): pass\n", r"no factory 'build' in it \(it defines other\)$"),
    "factory raises": ("def build(sparse_dims, sequence_fields, dense_count, options):\n"
                       "    raise RuntimeError('no GPU today')\n",
                       r"build\(\.\.\.\) raised RuntimeError: no GPU today \(at {file}:2\)$"),
    "factory raises ValueError": ("def build(*args):\n    raise ValueError('bad width')\n",
                                  r"build\(\.\.\.\) raised ValueError: bad width "
                                  r"\(at {file}:2\)$"),
    "returns no module": ("def build(sparse_dims, sequence_fields, dense_count, options):\n"
                          "    return {}\n",
                          r"build\(\.\.\.\) returned dict, not a torch\.nn\.Module$"),
    "forward raises": (FORWARD.format(body="return dense @ torch.ones(3, 3)"),
                       r"forward raised RuntimeError: .* \(at {file}:\d+\) on a sample batch "
                       r"of 4 rows$"),
    "shape [B, 1]": (FORWARD.format(body="return dense[:, :1] * self.w"),
                     r"forward returns shape \[4, 1\] for a batch of 4; return logits of "
                     r"shape \[batch\] \(e\.g\. \.squeeze\(1\)\)$"),
    "shape [1]": (FORWARD.format(body="return dense.sum() * self.w"),
                 r"forward returns shape \[1\] for a batch of 4; return logits of shape "
                 r"\[batch\]$"),
    "not a tensor": (FORWARD.format(body="return [1.0] * len(dense)"),
                     r"forward returns list, not a tensor of logits of shape \[batch\]$"),
    "non-finite": (FORWARD.format(body="return dense[:, 0] / 0.0"),
                   r"forward returns non-finite logits \(nan or inf\)"),
    "asks for a missing field": (FORWARD.format(body="return sparse['user_id'].sum(1)"),
                                 r"forward asks for sparse\['user_id'\] \(at {file}:\d+\), a "
                                 r"field this job lacks \(its sparse fields: c0, c1, c2, c3, "
                                 r"c4, c5, c6, c7\)$"),
    # the job's fields are single-valued at one width: a worker hands each as a strided view
    "needs its fields contiguous": (FORWARD.format(body="return sparse['c0'].view(-1)[:4]"),
                                    r"forward raised RuntimeError: view size is not compatible "
                                    r".* \(at {file}:\d+\) on a sample batch of 4 rows$"),
    "asks for lengths of a single field": (
        FORWARD.format(body="return lengths['c0'].float()"),
        r"forward asks for lengths\['c0'\] \(at {file}:\d+\), but c0 is not a sequence field "
        r"\(the job's: none; \[model\.pooling\] c0 = \"none\" makes a list field one\)$"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_module_is_one_line_naming_the_file_and_the_problem(tmp_path, case):
    body, pattern = BAD[case]
    job = user_job(tmp_path, body)
    file = str((tmp_path / "net.py").resolve())
    with pytest.raises(NetworkError) as caught:
        build_network(job)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"[model] module {file}: "), message
    assert re.search(pattern.format(file=re.escape(file)), message), message


def test_a_missing_file_is_named_with_where_it_was_looked_for(tmp_path):
    job = make_job('module = "nets/absent.py:build"', origin=tmp_path / "job.toml")
    with pytest.raises(NetworkError, match=re.escape(
            f"[model] module: no file {tmp_path.resolve()}/nets/absent.py")):
        build_network(job)


def test_a_failed_import_leaves_no_half_module_behind(tmp_path):
    before = set(sys.modules)
    with pytest.raises(NetworkError):
        build_network(user_job(tmp_path, "raise RuntimeError('half')\n"))
    assert set(sys.modules) == before


def test_the_example_din_job_builds_its_network_on_the_item_candidate():
    job = load_job(str(ROOT / "jobs" / "items_din.toml"), environ={})
    net = build_network(job)
    assert job.layout().sequence_fields == ["history"] and net.candidate == "item"
