"""A worker's arithmetic on one batch (torch; no sockets): the batch's embedding grid put
together from the shards' replies and read per field as the network contract has it
(``roles.model.sparse_input``), the dense network's forward and backward (on the worker's
own replica, or driven over its model-parallel group by the leader, ``roles.model.parallel``),
the scores of an evaluation batch, and the gradient rows each shard gets back.

``train`` and ``score`` take the network as ``model`` (a replica's) or, in a model-parallel
group, ``leader``; the dense optimiser's step is the sync mode's (``roles.algorithms.sync``).
"""

from __future__ import annotations

import numpy as np
import torch

from roles.algorithms.worker.pulled import PulledBatch
from roles.job.fields import FieldLayout
from roles.model.network import network_logits, weighted_loss_sum
from roles.model.networks import input_names
from roles.model.parallel import GroupLeader
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


class BatchCompute:
    def __init__(self, layout: FieldLayout, device: torch.device, precision: str = "fp32"):
        self.layout, self.device, self.precision = layout, device, precision
        self.dim = layout.row_dim
        self.sparse = SparseInputs(layout, device)
        self.fields = list(layout.fields)
        self.sequences = layout.sequence_fields

    def train(self, model: torch.nn.Module | None, leader: GroupLeader | None,
              batch: PulledBatch) -> tuple[float, float, list[np.ndarray]]:
        """Forward and backward of a training batch: its loss sum, its sample weight sum and
        the gradient rows for each shard (the dense gradients stay in the parameters)."""
        s = batch.sample
        replies, positions = arrived(batch)
        flat = self.grid(s, replies, positions)
        flat.requires_grad_(True)
        dense, labels, weights = self.tensors(s)
        weight_sum = float(weights.sum())
        loss_sum = self.forward_backward(model, leader, flat, s, dense, labels, weights,
                                         weight_sum)
        grads = self.shard_grads(gradient(flat), replies, positions)
        return float(loss_sum.detach()), weight_sum, grads

    def score(self, model: torch.nn.Module | None, leader: GroupLeader | None,
              batch: PulledBatch) -> np.ndarray:
        """The predicted probabilities of an evaluation batch."""
        s = batch.sample
        dense, _, _ = self.tensors(s)
        flat = self.grid(s, *arrived(batch))
        with torch.no_grad():
            return torch.sigmoid(self.logits(model, leader, flat, s, dense, False)).cpu().numpy()

    def grid(self, s: SampleBatch, replies: list[Embeddings],
             positions: list[np.ndarray]) -> torch.Tensor:
        """[grid, row_dim]: each shard's rows at their grid positions (one shard that holds
        every position, as with one shard: its rows in grid order, with no scatter)."""
        size = self.sparse.grid_size(len(s.labels), s.lengths)
        if len(replies) == 1 and len(positions[0]) == size:   # positions ascend: 0..size-1
            e = replies[0]
            return torch.from_numpy(np.take(e.rows, e.inverse, axis=0)).to(self.device)
        flat = torch.zeros((size, self.dim))
        for e, where in zip(replies, positions, strict=True):
            # numpy's take then torch's row copy: a third faster than numpy's own scatter
            flat.index_copy_(0, torch.from_numpy(where),
                             torch.from_numpy(np.take(e.rows, e.inverse, axis=0)))
        return flat.to(self.device)

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

    def shard_grads(self, flat_grad: torch.Tensor, replies: list[Embeddings],
                    positions: list[np.ndarray]) -> list[np.ndarray]:
        """Per shard, the gradient of each row it sent (rows used twice add up)."""
        out = []
        for e, where in zip(replies, positions, strict=True):
            rows = torch.zeros((e.rows.shape[0], self.dim), device=self.device)
            at = torch.from_numpy(where).to(self.device)
            inverse = torch.from_numpy(e.inverse.astype(np.int64)).to(self.device)
            rows.index_add_(0, inverse, flat_grad if len(where) == len(flat_grad)
                            else flat_grad[at])   # a shard with every position: no gather
            out.append(rows.cpu().numpy())
        return out
