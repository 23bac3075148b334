"""The worker's network as a task graph, and its partition plan over the devices of one
model-parallel group (``[cluster] parts``).

``trace`` runs torch.fx over the model and propagates the shapes of one example batch;
``task_graph`` turns the traced nodes into sub-tasks: cost = estimated FLOPs of one step's
forward pass (2 x in x out per row of a linear layer, one per output element otherwise), edges
= the tensors between nodes with their bytes. The inputs (placeholders) and the output are
pinned to part 0, the group's leader, which receives the batch and computes the loss.
``plan`` partitions that graph (``roles.model.partitioner``) and sums up what the plan costs.
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
from roles.model.networks import flat
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


def trace(model: torch.nn.Module, example: tuple[torch.Tensor, ...]) -> fx.GraphModule:
    gm = fx.symbolic_trace(model)
    ShapeProp(gm).propagate(*example)
    return gm


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
    nodes = list(gm.graph.nodes)
    index = {node: i for i, node in enumerate(nodes)}
    edges: list[tuple[int, int]] = []
    nbytes: list[float] = []
    for node in nodes:
        for source in node.all_input_nodes:
            edges.append((index[source], index[node]))
            nbytes.append(value_bytes(source))
    pinned = {index[n]: 0 for n in nodes if n.op in ("placeholder", "output")}
    return TaskGraph.build([n.name for n in nodes], [flops(gm, n) for n in nodes], edges,
                           nbytes, pinned=pinned)


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
    gm = trace(traced_network(job), example_inputs(job))
    return plan_graph(gm, partition_settings(job, parts), job.partition.critical_bytes,
                      job.partition.critical_path)
