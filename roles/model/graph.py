"""The worker's network as a task graph, and its partition plan over the devices of one
model-parallel group (``[cluster] parts``).

``trace`` runs torch.fx over the model and propagates the shapes of one example batch
(``trace_job``: the job's network, or one ``NetworkError`` line when torch.fx cannot trace it);
``task_graph`` turns the traced nodes into sub-tasks: cost = estimated FLOPs of one step's
forward pass (2 x in x out per row of a linear layer, one per output element otherwise), edges
= the values between nodes with their bytes. The inputs (placeholders) and the output are
pinned to part 0, the group's leader, which receives the batch and computes the loss. An edge
whose value is not a float tensor (the int64 lengths, a mask or index tensor, a shape, a tuple)
is *uncut*: its producer and its users stay on one part, because only float tensors cross
between members (``roles.model.parallel``). ``plan`` partitions that graph
(``roles.model.partitioner``) and sums up what the plan costs.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp

from roles.job.settings import Job
from roles.model.network import build_network
from roles.model.networks import NetworkError, flat, load_factory, network_label
from roles.model.networks.errors import describe, one_line
from roles.model.partitioner import PartitionSettings, partition
from roles.model.task_graph import TaskGraph


def traced_network(job: Job) -> torch.nn.Module:
    """The job's network with one tensor input per placeholder (``FlatInputs``: ``s<i>`` per
    sparse field, ``dense``, ``l<j>`` per sequence field), as the partitioner traces it; its
    parameters are the network's, in the same order."""
    layout = job.layout()
    return flat.FlatInputs(build_network(job), list(layout.fields), layout.sequence_fields)


def example_inputs(job: Job, rows: int | None = None) -> tuple[torch.Tensor, ...]:
    """A batch of ``rows`` (default: the batch size) in ``traced_network``'s input order."""
    return flat.example_inputs(job.layout(), len(job.dense_fields),
                               rows or job.train.batch_size)


NETWORK_PARAMETERS = "zbus_network_parameters"   # gm.meta key: see ``trace``


def trace(model: torch.nn.Module, example: tuple[torch.Tensor, ...]) -> fx.GraphModule:
    """``model`` traced by torch.fx, each node's shape and dtype propagated from ``example``.
    The GraphModule orders its parameters by first use and leaves out those no node uses; the
    module's own ``named_parameters()`` (the order of the flat weights every other role uses)
    are kept in ``gm.meta`` (``network_parameters``)."""
    gm = fx.symbolic_trace(model)
    ShapeProp(gm).propagate(*example)
    gm.meta[NETWORK_PARAMETERS] = list(model.named_parameters())
    return gm


def network_parameters(gm: fx.GraphModule) -> list[tuple[str, torch.nn.Parameter]]:
    """The traced module's parameters in its own ``named_parameters()`` order, by its names
    (for ``traced_network``: ``net.<name>``), those no node uses included."""
    return list(gm.meta.get(NETWORK_PARAMETERS) or gm.named_parameters())


def trace_job(job: Job, rows: int | None = None, parts: int | None = None) -> fx.GraphModule:
    """The job's network (``traced_network``) traced on ``rows`` rows (default: the batch
    size). A network torch.fx cannot trace (Python control flow on a tensor's values, ...) is
    one ``NetworkError`` line naming it, why, and that it runs with ``parts = 1``."""
    model = traced_network(job)   # a network that cannot be built: its own NetworkError
    try:
        return trace(model, example_inputs(job, rows))
    except Exception as exc:
        _, source_file = load_factory(job)
        cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc  # ShapeProp's
        reason = describe(cause, source_file) if source_file is not None \
            else f"{type(cause).__name__}: {one_line(str(cause))}"
        raise NetworkError(f"{network_label(job, source_file)} cannot be traced for "
                           f"[cluster] parts = {parts or job.cluster.parts}: {reason}; "
                           "run it with parts = 1") from exc


def value_bytes(node: fx.Node) -> int:
    meta = node.meta.get("tensor_meta")
    if meta is None or not hasattr(meta, "shape"):
        return 0
    return int(np.prod(meta.shape)) * torch.tensor([], dtype=meta.dtype).element_size()


def differentiable(node: fx.Node) -> bool:
    """A float tensor value: it can carry a gradient back over a cut."""
    meta = node.meta.get("tensor_meta")
    return meta is not None and hasattr(meta, "dtype") and meta.dtype.is_floating_point


def flops(gm: fx.GraphModule, node: fx.Node) -> float:
    if node.op in ("placeholder", "output", "get_attr"):
        return 0.0
    meta = node.meta.get("tensor_meta")
    elements = float(np.prod(meta.shape)) if meta is not None and hasattr(meta, "shape") else 1
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        if isinstance(module, torch.nn.Linear):
            return 2.0 * module.in_features * elements
    return elements


def task_graph(gm: fx.GraphModule) -> TaskGraph:
    """The traced nodes as sub-tasks; the placeholders and the output pinned to part 0; every
    edge whose value is not a float tensor uncut.

    Uncut, not pinned or weighted: the part of a non-float value's producer is not known before
    the partition, so its users cannot be pinned (except where the producer is a placeholder),
    and a large edge weight is only a preference (the random start, the balance bound and the
    rebalancing may still cut it). The partitioner contracts the sub-tasks joined by uncut edges
    into one unit before anything else (``roles.model.partitioner``), so no plan can cut one."""
    nodes = list(gm.graph.nodes)
    index = {node: i for i, node in enumerate(nodes)}
    edges: list[tuple[int, int]] = []
    nbytes: list[float] = []
    uncut: list[bool] = []
    for node in nodes:
        for source in node.all_input_nodes:
            edges.append((index[source], index[node]))
            nbytes.append(value_bytes(source))
            uncut.append(not differentiable(source))
    pinned = {index[n]: 0 for n in nodes if n.op in ("placeholder", "output")}
    return TaskGraph.build([n.name for n in nodes], [flops(gm, n) for n in nodes], edges,
                           nbytes, pinned=pinned, uncut=uncut)


@dataclass(frozen=True)
class PartitionReport:
    """What a partition of the network costs: per part its sub-tasks and load; the cut."""

    parts: int
    owner: dict[str, int]          # node name -> part
    nodes: list[list[str]]         # per part
    load: list[float]              # per part, FLOPs of one forward pass
    balance: float
    balanced: bool
    edges: int
    critical_edges: int
    cut_edges: int
    cut_critical: int
    bytes_per_step: int            # forward activations + backward gradients over the bus
    seconds: float

    def summary(self) -> dict:
        s = asdict(self)
        s.pop("owner")
        return s


def plan_graph(gm: fx.GraphModule, settings: PartitionSettings, critical_bytes: float,
               critical_path: bool) -> PartitionReport:
    started = time.perf_counter()
    g = task_graph(gm)
    g.mark_critical(critical_bytes, critical_path)
    result = partition(g, settings)
    owner = {name: int(p) for name, p in zip(g.names, result.assign, strict=True)}
    sent = 0   # each value once to every other part that uses it, gradients as much back
    for node in gm.graph.nodes:
        users = {owner[u.name] for u in node.users} - {owner[node.name]}
        sent += value_bytes(node) * len(users) * (2 if differentiable(node) else 1)
    k = settings.parts
    return PartitionReport(k, owner, [[n for n in g.names if owner[n] == p] for p in range(k)],
                     [round(float(x), 1) for x in result.loads], round(result.balance, 4),
                     result.balanced, g.m, int(g.critical.sum()), result.cut_edges,
                     result.cut_critical, int(sent), round(time.perf_counter() - started, 4))


def partition_settings(job: Job, parts: int | None = None) -> PartitionSettings:
    p = job.partition
    return PartitionSettings(parts=parts or job.cluster.parts, balance=p.balance,
                             threshold=p.threshold, target=p.target, pick=p.pick, seed=p.seed,
                             tries=p.tries)


def plan_job(job: Job, parts: int | None = None) -> PartitionReport:
    """The plan of the job's network over ``parts`` devices (default: the job's)."""
    gm = trace_job(job, parts=parts)
    return plan_graph(gm, partition_settings(job, parts), job.partition.critical_bytes,
                      job.partition.critical_path)
