"""A worker's arithmetic on one batch (torch; no sockets): the batch's embedding grid put
together from the shards' replies and read per field as the network contract has it
(``roles.model.sparse_input``), the dense network's forward and backward (on the worker's
own replica, or driven over its model-parallel group by the leader, ``roles.model.parallel``),
the scores of an evaluation batch, and the gradient rows each shard gets back.

``train`` and ``score`` take the network as ``model`` (a replica's) or, in a model-parallel
group, ``leader``; the dense optimiser's step is the sync mode's (``roles.algorithms.sync``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from roles.algorithms.worker.pulled import PulledBatch
from roles.job.fields import FieldLayout
from roles.model.network import network_logits, weighted_loss_sum
from roles.model.networks import input_names
from roles.model.parallel import GroupLeader
from roles.model.row_sums import RowSums
from roles.model.sparse_input import SparseInputs
from roles.protocol.datapath import Embeddings, SampleBatch


def arrived(batch: PulledBatch) -> tuple[list[Embeddings], list[np.ndarray]]:
    """Each shard's reply and its grid positions: all in by the time a batch runs
    (``PulledBatch.complete``)."""
    replies = [e for e in batch.replies if e is not None]
    positions = [p for p in batch.positions if p is not None]
    if len(replies) < len(batch.replies) or len(positions) < len(batch.positions):
        raise ValueError(f"batch {batch.batch_id} runs without every shard's embeddings")
    return replies, positions


def replica(model: torch.nn.Module | None) -> torch.nn.Module:
    """The worker's own network, when it runs without a model-parallel group leader."""
    if model is None:
        raise ValueError("a batch needs the worker's network or its group's leader")
    return model


def gradient(t: torch.Tensor) -> torch.Tensor:
    """The gradient the backward pass left in ``t``."""
    if t.grad is None:
        raise RuntimeError("the backward pass left no gradient")
    return t.grad


def placeholders(sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                 lengths: dict[str, torch.Tensor], fields: list[str],
                 sequences: list[str]) -> dict[str, torch.Tensor]:
    """The network's inputs by the traced graph's placeholder names (``FlatInputs``: ``s<i>``
    per sparse field, ``dense``, ``l<j>`` per sequence field), for a model-parallel leader."""
    values = [*(sparse[f] for f in fields), dense, *(lengths[f] for f in sequences)]
    return dict(zip(input_names(len(fields), len(sequences)), values, strict=True))


@dataclass(frozen=True, slots=True)
class GatheredRows:
    """A batch's embedding rows as one array (every shard's in turn, the shard ``i``'s from
    ``starts[i]`` to ``starts[i + 1]``; a row of zeros after them if a position had none) and
    the row of each grid position (``index``, in the order the network reads the grid:
    ``SparseInputs.sample_order``)."""

    rows: np.ndarray
    index: np.ndarray
    starts: list[int]


class BatchCompute:
    def __init__(self, layout: FieldLayout, device: torch.device, precision: str = "fp32"):
        self.layout, self.device, self.precision = layout, device, precision
        self.dim = layout.row_dim
        self.sparse = SparseInputs(layout, device)
        self.fields = list(layout.fields)
        self.sequences = layout.sequence_fields
        self.row_sums = RowSums(device)   # its compiled loop loaded now, at the start

    def train(self, model: torch.nn.Module | None, leader: GroupLeader | None,
              batch: PulledBatch) -> tuple[float, float, list[np.ndarray]]:
        """Forward and backward of a training batch: its loss sum, its sample weight sum and
        the gradient rows for each shard (the dense gradients stay in the parameters)."""
        s = batch.sample
        rows = self.gathered(s, *arrived(batch))
        flat = self.grid(rows)
        flat.requires_grad_(True)
        dense, labels, weights = self.tensors(s)
        weight_sum = float(weights.sum())
        loss_sum = self.forward_backward(model, leader, flat, s, dense, labels, weights,
                                         weight_sum)
        return float(loss_sum.detach()), weight_sum, self.shard_grads(gradient(flat), rows)

    def score(self, model: torch.nn.Module | None, leader: GroupLeader | None,
              batch: PulledBatch) -> np.ndarray:
        """The predicted probabilities of an evaluation batch."""
        s = batch.sample
        dense, _, _ = self.tensors(s)
        flat = self.grid(self.gathered(s, *arrived(batch)))
        with torch.no_grad():
            return torch.sigmoid(self.logits(model, leader, flat, s, dense, False)).cpu().numpy()

    def warm_up(self, model: torch.nn.Module | None, samples: int, dense: int) -> None:
        """One forward and backward of a batch of zeros, its gradients dropped and no step
        taken: torch's first calls (allocations, oneDNN's primitives; a worker's first Adult
        batches took two to three times as long as the next) made while the worker waits for
        its first batch, not in it. The network is left as it was: its buffers (a batch
        norm's running statistics) restored, the random generators' states too (dropout)."""
        net = replica(model)
        buffers = {name: b.detach().clone() for name, b in net.named_buffers()}
        cuda = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            self._zeros_through(net, samples, dense)
        with torch.no_grad():
            for name, b in net.named_buffers():
                b.copy_(buffers[name])
        net.zero_grad(set_to_none=True)

    def _zeros_through(self, net: torch.nn.Module, samples: int, dense: int) -> None:
        s = SampleBatch(batch_id=0, epoch=0, eval=False, min_round=0, round=0,
                        dense=np.zeros((samples, dense), np.float32),
                        labels=np.zeros(samples, np.float32),
                        weights=np.ones(samples, np.float32),
                        lengths=np.ones((samples, len(self.layout.list_fields)), np.int32))
        flat = torch.zeros((self.sparse.grid_size(samples, s.lengths), self.dim),
                           device=self.device, requires_grad=True)
        d, labels, weights = self.tensors(s)
        self.forward_backward(net, None, flat, s, d, labels, weights, float(samples))

    def gathered(self, s: SampleBatch, replies: list[Embeddings],
                 positions: list[np.ndarray]) -> GatheredRows:
        """Every shard's rows in one array and each grid position's row in it."""
        size = self.sparse.grid_size(len(s.labels), s.lengths)
        starts = np.cumsum([0, *(len(e.rows) for e in replies)])
        covered = sum(len(where) for where in positions) == size
        parts = [e.rows for e in replies]
        if not covered:   # a position no shard holds reads a row of zeros
            parts.append(np.zeros((1, self.dim), dtype=np.float32))
        rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
        index = np.full(size, starts[-1], dtype=np.int64)
        for e, where, start in zip(replies, positions, starts, strict=False):
            index[where] = e.inverse + start
        return GatheredRows(rows, self.sparse.sample_order(index, len(s.labels)),
                            starts.tolist())

    def grid(self, rows: GatheredRows) -> torch.Tensor:
        """[grid, row_dim]: each position's row (one numpy take, no zeroed grid filled shard
        by shard: with ``shard_grads``, 0.62 against 1.38 ms a Criteo batch on two shards)."""
        return torch.from_numpy(np.take(rows.rows, rows.index, axis=0)).to(self.device)

    def tensors(self, s: SampleBatch) -> tuple[torch.Tensor, ...]:
        """The batch's dense features, labels and weights."""
        return tuple(torch.from_numpy(np.array(a)).to(self.device)
                     for a in (s.dense, s.labels, s.weights))

    def logits(self, model: torch.nn.Module | None, leader: GroupLeader | None,
               flat: torch.Tensor, s: SampleBatch, dense: torch.Tensor,
               train: bool) -> torch.Tensor:
        """The network's logits for the batch, on the worker's replica or over its group."""
        sparse, lengths = self.sparse.inputs(flat, len(s.labels), s.lengths)
        if leader is None:
            return network_logits(replica(model), sparse, dense, lengths, self.precision)
        return leader.forward(placeholders(sparse, dense, lengths, self.fields,
                                           self.sequences), train=train)

    def forward_backward(self, model: torch.nn.Module | None, leader: GroupLeader | None,
                         flat: torch.Tensor, s: SampleBatch, dense: torch.Tensor,
                         labels: torch.Tensor, weights: torch.Tensor,
                         weight_sum: float) -> torch.Tensor:
        """Loss sum of the batch; the gradients land in flat.grad and the dense parameters
        (of ``model``, or with a ``leader`` those of its group)."""
        if leader is None:
            net = replica(model)
            loss_sum = weighted_loss_sum(self.logits(net, None, flat, s, dense, True), labels,
                                         weights)
            net.zero_grad(set_to_none=True)
            (loss_sum / max(weight_sum, 1e-12)).backward()
            return loss_sum
        logits = self.logits(None, leader, flat, s, dense, True)
        leaf = logits.detach().requires_grad_(True)
        loss_sum = weighted_loss_sum(leaf, labels, weights)
        (loss_sum / max(weight_sum, 1e-12)).backward()
        leader.backward(gradient(leaf))
        return loss_sum

    def shard_grads(self, flat_grad: torch.Tensor, rows: GatheredRows) -> list[np.ndarray]:
        """Per shard, the gradient of each row it sent (rows used twice add up): one sum over
        the grid into every shard's rows (``RowSums``), then each shard's slice."""
        summed = self.row_sums.sums(rows.index, flat_grad, len(rows.rows))
        return [summed[a:b] for a, b in zip(rows.starts, rows.starts[1:], strict=False)]
