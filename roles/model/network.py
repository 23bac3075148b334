"""The dense network every worker trains: per-field embeddings (looked up on the shards) and
dense features, concatenated, through an MLP to one logit."""

from __future__ import annotations

import os
import socket
from collections.abc import Collection

import psutil
import torch
from torch import nn

from roles.job.settings import Job
from roles.protocol.topology import ClusterConfig
from zbus.endpoints import tcp_host


class CtrNet(nn.Module):
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


def build_model(job: Job) -> CtrNet:
    """The same initial weights in every process that builds it (seeded, built on the CPU)."""
    torch.manual_seed(job.train.seed)
    return CtrNet(len(job.sparse_fields), job.model.embedding_dim, len(job.dense_fields),
                  job.model.hidden)


def weighted_loss_sum(logits: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> torch.Tensor:
    """Sum over samples of weight x binary cross-entropy."""
    losses = nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    return (losses * weights).sum()


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
