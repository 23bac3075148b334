"""The dense network every worker trains, and the torch settings of a worker's process.

``build_network`` makes the job's network (``roles.model.networks``: a built-in named by
``[model] network`` or the user's ``[model] module``), the same in every process.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Collection

import psutil
import torch
from torch import nn

from roles.job.settings import Job
from roles.model.networks import call_factory, check_network, load_factory, network_label
from roles.model.networks.registry import LAYOUT_DEFAULTS
from roles.protocol.topology import ClusterConfig
from zbus.endpoints import tcp_host


def build_network(job: Job) -> nn.Module:
    """The job's network, with the same initial weights in every process that builds it (seeded
    with ``[train] seed``, built on the CPU), checked on a sample batch of the job's shapes; a
    network that cannot be loaded, built or run is one ``NetworkError`` line. A job of several
    labels (``Job.tasks``) gives the factory ``options["tasks"]``, the labels in order, and
    the network must return ``[B, T]``."""
    layout = job.layout()
    factory, source_file = load_factory(job)
    label = network_label(job, source_file)
    dense_count = len(job.dense_fields)
    options = {"hidden": list(job.model.hidden), **job.model.options}
    tasks = job.tasks
    if len(tasks) > 1:   # one logit per label; a job of one label gives no "tasks" (as before)
        options["tasks"] = list(tasks)
    if not job.model.module and job.model.network in LAYOUT_DEFAULTS:
        options = {**LAYOUT_DEFAULTS[job.model.network](layout, options), **options}
    if not job.model.module and job.layout_crosses:
        options.pop("crosses", None)   # the layout's (its cross: fields), not the built-in's
    torch.manual_seed(job.train.seed)
    net = call_factory(factory, layout, dense_count, options, label, source_file,
                       builtin=not job.model.module)
    check_network(net, layout, dense_count, label, source_file, tasks=len(tasks))
    return net


def network_logits(net: nn.Module, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                   lengths: dict[str, torch.Tensor], precision: str) -> torch.Tensor:
    """The network's logits, float32. With ``precision`` "bf16" its forward runs under torch's
    autocast to bfloat16 on the inputs' device (``[train] precision``): the matrix products in
    bfloat16, the weights and every gradient leaving the network (to the weights, to the
    embedding inputs) float32."""
    if precision == "fp32":
        return net(sparse, dense, lengths)
    with torch.autocast(device_type=dense.device.type, dtype=torch.bfloat16):
        out = net(sparse, dense, lengths)
    return out.float()


def bf16_is_native(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 in hardware (CUDA's own check; on the CPU,
    oneDNN's: AVX512-BF16 or AMX). Elsewhere autocast to bfloat16 is emulated, and slower."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def logit_shift(job: Job) -> float:
    """What negative down-sampling (``[data] negative_rate`` = r) adds to the label's
    logit to undo it: log r, so that sigmoid gives p / (p + (1 − p) / r); 0 without it."""
    rate = job.data.negative_rate
    return math.log(rate) if rate < 1.0 else 0.0


def scored(logits: torch.Tensor, shift: float) -> torch.Tensor:
    """Probabilities of the network's logits (``[B]`` or ``[B, T]``), corrected by ``shift``
    (``logit_shift``: a job of one label, the only one down-sampling is allowed in)."""
    return torch.sigmoid(logits + shift if shift else logits)


def task_weights(job: Job) -> torch.Tensor | None:
    """The tasks' loss weights (``[model.tasks]``) for ``weighted_loss_sum``; None for one."""
    weights = job.task_weights()
    return torch.tensor(weights, dtype=torch.float32) if len(weights) > 1 else None


def weighted_loss_sum(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      task_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Sum over samples of weight x binary cross-entropy. With several labels (``[B, T]``):
    summed over the tasks too, each times its ``task_weights`` (``[model.tasks]``), a NaN
    label masking that task for its sample."""
    if labels.dim() == 1:
        losses = nn.functional.binary_cross_entropy_with_logits(logits, labels,
                                                                reduction="none")
        return (losses * weights).sum()
    present = ~torch.isnan(labels)
    losses = nn.functional.binary_cross_entropy_with_logits(
        logits, torch.where(present, labels, torch.zeros_like(labels)), reduction="none")
    scale = weights.unsqueeze(1) * present
    if task_weights is not None:
        scale = scale * task_weights.unsqueeze(0)
    return (losses * scale).sum()


def pick_device(setting: str) -> torch.device:
    """CUDA when present (or asked for), the CPU otherwise."""
    if setting == "cuda" or (setting == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("[train] device = \"cuda\" but no CUDA device is available")
        return torch.device("cuda")
    return torch.device("cpu")


def auto_threads(cluster: ClusterConfig, cpus: int, here: Collection[str] = ()) -> int:
    """Torch threads per worker when the job leaves it to zbus. On one host the feeder and
    every shard keep a core busy, and the workers share the rest. Across hosts a worker leaves
    a core to each feeder and shard whose endpoint is on its own host (``here``: this host's
    addresses, ``local_addresses``) and takes the rest; it cannot know how many workers share
    its host (they bind nothing): set torch_threads when several do."""
    if cluster.single_host():
        return max(1, (cpus - 1 - cluster.shards) // cluster.workers)
    busy = set()
    for name in cluster.endpoint_names():
        owner = cluster.endpoint_owner(name)
        if owner.split("-")[0] in ("feeder", "ps") and tcp_host(cluster.endpoint(name)) in here:
            busy.add(owner)
    return max(1, cpus - len(busy))


def local_addresses() -> set[str]:
    """This host's (this network namespace's) IP addresses."""
    return {a.address.split("%")[0] for addresses in psutil.net_if_addrs().values()
            for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6)}


def set_threads(threads: int) -> int:
    torch.set_num_threads(threads)
    return threads


def use_threads(job: Job) -> int:
    """Set this process's torch threads: ``[train] torch_threads``, or ``auto_threads`` for
    this host; the number set."""
    return set_threads(job.train.torch_threads or
                       auto_threads(job.cluster, os.cpu_count() or 1, local_addresses()))
