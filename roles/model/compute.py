"""A worker's arithmetic on one batch (torch; no sockets): the batch's embedding grid put
together from the shards' replies and read per field as the network contract has it
(``roles.model.sparse_input``), the dense network's forward and backward, the scores of an
evaluation batch, and the gradient rows each shard gets back.

``train`` and ``score`` run a batch on the worker's own network (``model``, its replica's). A
worker that leads a model-parallel group runs the network over its group, whose members answer
through its loop (``roles.worker.group_link``): ``group_batch`` is the batch's side of that
(the network's inputs by the traced graph's placeholder names), ``group_loss`` the gradient of
the group's output, ``group_result`` the batch's figures and gradient rows once the group's
backward is done, ``group_scores`` an evaluation batch's. The dense optimiser's step is the
sync mode's (``roles.algorithms.sync``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from roles.algorithms.worker.pulled import PulledBatch
from roles.job.fields import FieldLayout
from roles.model.network import network_logits, scored, weighted_loss_sum
from roles.model.networks import input_names
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


@dataclass(slots=True)
class GroupBatch:
    """A batch on its way through a model-parallel group: its rows, its grid (a leaf, in
    training, whose gradient the group's backward leaves), its labels and weights, and the
    network's inputs by placeholder name; the loss once the group's output is in."""

    rows: GatheredRows
    grid: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor
    weight_sum: float
    inputs: dict[str, torch.Tensor]
    loss_sum: torch.Tensor | None = None


class BatchCompute:
    def __init__(self, layout: FieldLayout, device: torch.device, precision: str = "fp32",
                 score_training: bool = False, task_weights: torch.Tensor | None = None,
                 logit_shift: float = 0.0):
        """``score_training``: a training batch's probabilities, from the forward pass that
        trains on it (the model before the batch: a stream job's progressive validation),
        come back with its loss. ``task_weights``: each label's loss weight, with several
        (``roles.model.network.task_weights``; None for one label); ``logit_shift``: what an
        evaluation adds to the logit (``roles.model.network.logit_shift``: negative
        down-sampling undone)."""
        self.logit_shift = logit_shift
        self.score_training = score_training
        self.tasks = 1 if task_weights is None else len(task_weights)
        self.task_weights = None if task_weights is None else task_weights.to(device)
        self.layout, self.device, self.precision = layout, device, precision
        self.dim = layout.row_dim
        self.sparse = SparseInputs(layout, device)
        self.fields = list(layout.fields)
        self.sequences = layout.sequence_fields
        self.row_sums = RowSums(device)   # its compiled loop loaded now, at the start

    def train(self, model: torch.nn.Module, batch: PulledBatch
              ) -> tuple[float, float, list[np.ndarray], np.ndarray | None]:
        """Forward and backward of a training batch: its loss sum, its sample weight sum, the
        gradient rows for each shard (the dense gradients stay in the parameters) and, with
        ``score_training``, its probabilities before the step (else None)."""
        s = batch.sample
        rows = self.gathered(s, *arrived(batch))
        flat = self.grid(rows)
        flat.requires_grad_(True)
        dense, labels, weights = self.tensors(s)
        weight_sum = float(weights.sum())
        loss_sum, logits = self.forward_backward(model, flat, s, dense, labels, weights,
                                                 weight_sum)
        probs = torch.sigmoid(logits.detach().float()).cpu().numpy() \
            if self.score_training else None
        return float(loss_sum.detach()), weight_sum, self.shard_grads(gradient(flat), rows), \
            probs

    def score(self, model: torch.nn.Module, batch: PulledBatch) -> np.ndarray:
        """The predicted probabilities of an evaluation batch."""
        s = batch.sample
        dense, _, _ = self.tensors(s)
        flat = self.grid(self.gathered(s, *arrived(batch)))
        with torch.no_grad():
            return scored(self.logits(model, flat, s, dense), self.logit_shift).cpu().numpy()

    def warm_up(self, net: torch.nn.Module, samples: int, dense: int) -> None:
        """One forward and backward of a batch of zeros, its gradients dropped and no step
        taken: torch's first calls (allocations, oneDNN's primitives; a worker's first Adult
        batches took two to three times as long as the next) made while the worker waits for
        its first batch, not in it. The network is left as it was: its buffers (a batch
        norm's running statistics) restored, the random generators' states too (dropout)."""
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
                        labels=np.zeros(samples * self.tasks, np.float32),
                        weights=np.ones(samples, np.float32),
                        lengths=np.ones((samples, len(self.layout.list_fields)), np.int32))
        flat = torch.zeros((self.sparse.grid_size(samples, s.lengths), self.dim),
                           device=self.device, requires_grad=True)
        d, labels, weights = self.tensors(s)
        self.forward_backward(net, flat, s, d, labels, weights, float(samples))

    def gathered(self, s: SampleBatch, replies: list[Embeddings],
                 positions: list[np.ndarray]) -> GatheredRows:
        """Every shard's rows in one array and each grid position's row in it."""
        size = self.sparse.grid_size(len(s.weights), s.lengths)
        starts = np.cumsum([0, *(len(e.rows) for e in replies)])
        covered = sum(len(where) for where in positions) == size
        parts = [e.rows for e in replies]
        if not covered:   # a position no shard holds reads a row of zeros
            parts.append(np.zeros((1, self.dim), dtype=np.float32))
        rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
        index = np.full(size, starts[-1], dtype=np.int64)
        for e, where, start in zip(replies, positions, starts, strict=False):
            index[where] = e.inverse + start
        return GatheredRows(rows, self.sparse.sample_order(index, len(s.weights)),
                            starts.tolist())

    def grid(self, rows: GatheredRows) -> torch.Tensor:
        """[grid, row_dim]: each position's row (one numpy take, no zeroed grid filled shard
        by shard: with ``shard_grads``, 0.62 against 1.38 ms a Criteo batch on two shards)."""
        return torch.from_numpy(np.take(rows.rows, rows.index, axis=0)).to(self.device)

    def tensors(self, s: SampleBatch) -> tuple[torch.Tensor, ...]:
        """The batch's dense features, labels and weights."""
        return tuple(torch.from_numpy(np.array(a)).to(self.device)
                     for a in (s.dense, s.task_labels(), s.weights))

    def logits(self, model: torch.nn.Module, flat: torch.Tensor, s: SampleBatch,
               dense: torch.Tensor) -> torch.Tensor:
        """The network's logits for the batch, on the worker's own network."""
        sparse, lengths = self.sparse.inputs(flat, len(s.weights), s.lengths)
        return network_logits(model, sparse, dense, lengths, self.precision)

    def forward_backward(self, model: torch.nn.Module, flat: torch.Tensor, s: SampleBatch,
                         dense: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                         weight_sum: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss sum of the batch and its logits; the gradients land in flat.grad and
        ``model``'s parameters."""
        logits = self.logits(model, flat, s, dense)
        loss_sum = weighted_loss_sum(logits, labels, weights, self.task_weights)
        model.zero_grad(set_to_none=True)
        (loss_sum / max(weight_sum, 1e-12)).backward()
        return loss_sum, logits

    # -- over a model-parallel group -------------------------------------------------------------
    def group_batch(self, batch: PulledBatch, train: bool) -> GroupBatch:
        """The batch's grid, tensors and the network's inputs, to run over the group."""
        s = batch.sample
        rows = self.gathered(s, *arrived(batch))
        grid = self.grid(rows)
        if train:
            grid.requires_grad_(True)
        dense, labels, weights = self.tensors(s)
        with torch.set_grad_enabled(train):
            sparse, lengths = self.sparse.inputs(grid, len(s.weights), s.lengths)
        return GroupBatch(rows, grid, labels, weights, float(weights.sum()),
                          placeholders(sparse, dense, lengths, self.fields, self.sequences))

    def group_loss(self, b: GroupBatch, logits: torch.Tensor) -> torch.Tensor:
        """The loss of the group's output (kept in ``b``) and its gradient, from which the
        group's backward starts."""
        leaf = logits.detach().requires_grad_(True)
        b.loss_sum = weighted_loss_sum(leaf, b.labels, b.weights, self.task_weights)
        (b.loss_sum / max(b.weight_sum, 1e-12)).backward()
        return gradient(leaf)

    def group_result(self, b: GroupBatch) -> tuple[float, float, list[np.ndarray]]:
        """As ``train``'s, once the group's backward has left the grid's gradient."""
        if b.loss_sum is None:
            raise RuntimeError("the group's batch has no loss yet")
        return float(b.loss_sum.detach()), b.weight_sum, self.shard_grads(gradient(b.grid),
                                                                          b.rows)

    def group_scores(self, logits: torch.Tensor) -> np.ndarray:
        """The predicted probabilities from the group's output of an evaluation batch."""
        with torch.no_grad():
            return scored(logits, self.logit_shift).cpu().numpy()

    def shard_grads(self, flat_grad: torch.Tensor, rows: GatheredRows) -> list[np.ndarray]:
        """Per shard, the gradient of each row it sent (rows used twice add up): one sum over
        the grid into every shard's rows (``RowSums``), then each shard's slice."""
        summed = self.row_sums.sums(rows.index, flat_grad, len(rows.rows))
        return [summed[a:b] for a, b in zip(rows.starts, rows.starts[1:], strict=False)]
