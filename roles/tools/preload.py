"""The strong single process: the job's data loaded once into memory, then trained as a PyTorch
user would train it (``zbus-reference --preload``), the yardstick the cluster is measured against.

Load: every part of the data's index (``roles.data.source``: the same parts, so the same eval
split as the cluster's, whatever decides it) is read with the feeder's readers (pyarrow's
multi-threaded CSV parser over large chunks, Parquet row groups; the same rejected rows), the
parts on a pool of threads; each block's keys are hashed at once (``slot_keys``:
zbus-key-v2, the job's slots), its raw dense values kept until the training parts' statistics
are known (summarised from memory, ``DataSource.preparer``), then the same dense transform and
weights as a feeder's (``Preparer``). The keys of each embedding table are then numbered
(``np.unique`` over all of them, training and eval rows alike) into rows of one embedding
matrix [rows, row_dim], uniform in [-embedding_init, embedding_init] as a shard's initial rows
are (drawn by torch, seeded with ``[train] seed``: a shard's are a hash of each key, which
costs seconds a million keys); a slot holds its row (int32; ``-1`` for a list field's
padding).

Train, on the CPU (``[train] device`` is not read): the job's network (``build_network``) with
Adam at ``dense_lr``; the embeddings an ``nn.Embedding(sparse=True)`` trained with
``torch.optim.Adagrad`` at ``embedding_lr`` (its step is the shards' sparse Adagrad: the sum of
squared gradients, eps 1e-10, no initial accumulator; ``RowwiseAdagrad`` with ``[train]
embedding_optimizer = "rowwise_adagrad"``); each epoch a permutation of the
training rows seeded by (seed, epoch) (file order with ``[train] shuffle = false``), batches
of ``batch_size`` rows sliced from it; the loss the weighted mean of the batch's
(``weighted_loss_sum``). The network gets its inputs as a worker's does (``SparseInputs`` over
the batch's grid of rows), so list fields, pooled or sequences, work.
Eval: the eval rows in file order, ``eval_batch_size`` at a time (as the cluster), scored into a
``TaskScores`` (the cluster's AUC and log
loss). ``batch_by_label`` is refused (a permutation cannot keep one label per batch).

Memory holds the whole data set (about 4 bytes a slot, 4 a dense value and 8 a row, plus the
embedding matrix and its Adagrad state at 8 x row_dim bytes a key, 4 x row_dim + 4 with
``rowwise_adagrad``, and the raw columns while
loading): it is the single process's limit, not the cluster's.
"""

from __future__ import annotations

import os
import resource
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from roles.algorithms.shared.dense_optimizer import dense_adam
from roles.algorithms.shared.metrics import TaskScores
from roles.data.compiled import AVAILABLE
from roles.data.hashing import compiled_loop
from roles.data.index import DataError, Part
from roles.data.source import DataSource
from roles.data.stream import Parsed, Samples, Tally
from roles.job.fields import PAD, FieldLayout
from roles.job.settings import Job
from roles.model.network import (
    build_network,
    logit_shift,
    network_logits,
    scored,
    set_threads,
    task_weights,
    weighted_loss_sum,
)
from roles.model.sparse_input import SparseInputs


@dataclass(frozen=True)
class Loaded:
    """The data set in memory: rows [0, train) train, the rest are the eval rows."""

    rows: np.ndarray      # int32 [n, slots]: each slot's embedding row (-1: a list's padding)
    dense: np.ndarray     # float32 [n, dense]
    labels: np.ndarray    # float32 [n]
    weights: np.ndarray   # float32 [n]
    train: int
    keys: int             # distinct keys: rows of the embedding matrix
    tally: Tally          # rows read and rejected (all), dropped and merged (training)
    stages: dict[str, float]   # seconds: index, read (parse, hash), prepare, number
    widths: np.ndarray | None = None   # float32 [keys]: each row's table's width, where tables
                                       # are narrower than the rows (row-wise Adagrad's mean)


def load(job: Job, workers: int) -> Loaded:
    """Every part of the job's data read, hashed, transformed and weighted once."""
    stages, start = {}, time.perf_counter()

    def stage(name: str) -> None:
        nonlocal start
        now = time.perf_counter()
        stages[name], start = now - start, now

    source = DataSource(job)
    files, parts, _ = source.index()
    stage("index")
    source.files = files
    layout = job.layout()

    def read(part: Part) -> list[Parsed]:
        return [Parsed.of(layout, b) for b in source.blocks(part)]

    if AVAILABLE:
        compiled_loop()   # the keys' compiled loop, loaded once before the threads hash
    with ThreadPoolExecutor(workers) as pool:
        held = dict(zip((p.number for p in parts), pool.map(read, parts), strict=True))
        stage("read")
        prepare = source.preparer(parts, lambda p: (h.raw for h in held[p.number]))
        training, evaluating = [p for p in parts if not p.eval], [p for p in parts if p.eval]
        tally = Tally()

        def samples(part: Part) -> tuple[list[Samples], Tally]:
            mine = Tally()
            out = [prepare.parsed(h, not part.eval, mine) for h in held.pop(part.number)]
            return out, mine

        train: list[Samples] = []
        eval_: list[Samples] = []
        for part, (got, mine) in zip(training + evaluating,
                                     pool.map(samples, training + evaluating), strict=True):
            (eval_ if part.eval else train).extend(got)
            tally.add(mine)
        n_train = sum(len(s) for s in train)
        blocks = train + eval_
        del train, eval_
        dense, labels, weights = (np.concatenate([getattr(s, k) for s in blocks])
                                  for k in ("dense", "labels", "weights"))
        keys = [s.keys for s in blocks]   # numbered block by block: never joined whole
        del blocks
        stage("prepare")
        rows, counts = number_keys(layout, keys, pool)
        stage("number")
    widths = None
    if not layout.one_width:
        width = {t: d for t, d in zip(layout.tables, layout.dims, strict=True)}
        widths = np.concatenate([np.full(n, width[t], np.float32) for t, n in counts.items()])
    return Loaded(rows, dense, labels, weights, n_train, sum(counts.values()), tally, stages,
                  widths)


def number_keys(layout: FieldLayout, keys: list[np.ndarray],
                pool: ThreadPoolExecutor) -> tuple[np.ndarray, dict[str, int]]:
    """Each slot's row of one embedding matrix (tables one after another, a table's keys in
    sorted order; -1 for ``PAD``) for the rows of ``keys``' blocks one after another, and each
    table's number of rows (distinct keys), in the matrix's order."""
    tables = list(dict.fromkeys(layout.tables))
    columns = {table: np.concatenate([np.arange(layout.slot_range(f).start,
                                                layout.slot_range(f).stop)
                                      for f, name in enumerate(layout.tables) if name == table])
               for table in tables}
    padded = {table: any(layout.is_list(f) for f, name in enumerate(layout.tables)
                         if name == table) for table in tables}
    rows = np.empty((sum(len(k) for k in keys), layout.slots), dtype=np.int32)

    def number(table: str) -> int:
        """Its slots get their key's index among the table's distinct keys; how many."""
        block = np.concatenate([k[:, columns[table]] for k in keys])
        if padded[table]:
            present = block != PAD
            uniq, inverse = np.unique(block[present], return_inverse=True)
            mine = np.full(present.shape, -1, dtype=np.int32)
            mine[present] = inverse.reshape(-1)
        else:
            uniq, inverse = np.unique(block.reshape(-1), return_inverse=True)
            mine = inverse.reshape(block.shape).astype(np.int32)
        rows[:, columns[table]] = mine   # each table's own columns: no two threads share one
        return len(uniq)

    distinct = list(pool.map(number, tables))
    total = sum(distinct)
    if total >= np.iinfo(np.int32).max:
        raise DataError(f"{total:,} distinct keys: more than the preloaded reference numbers")
    offset = 0
    for table, count in zip(tables, distinct, strict=True):
        if offset:
            mine = rows[:, columns[table]]
            if padded[table]:
                mine[mine >= 0] += offset
            else:
                mine += offset
            rows[:, columns[table]] = mine
        offset += count
    return rows, dict(zip(tables, distinct, strict=True))


class RowwiseAdagrad:
    """Row-wise Adagrad over a sparse embedding's gradient, as a shard steps
    (``EmbeddingTable.adagrad`` with ``rowwise``): each row's sum of squared gradients gains the
    mean of its gradient's squares; the row moves by lr × g / (sqrt(sum) + eps)."""

    def __init__(self, weight: torch.Tensor, lr: float, eps: float = 1e-10,
                 widths: np.ndarray | None = None):
        """``widths``: each row's table's width where tables are narrower than the rows (the
        mean is over the table's values), else None."""
        self.weight, self.lr, self.eps = weight, lr, eps
        self.sums = torch.zeros(weight.shape[0])
        self.widths = None if widths is None else torch.from_numpy(widths)

    def zero_grad(self) -> None:
        self.weight.grad = None

    @torch.no_grad()
    def step(self) -> None:
        if self.weight.grad is None:
            return
        grad = self.weight.grad.coalesce()
        rows, values = grad.indices()[0], grad.values()
        squares = values.pow(2)
        sums = self.sums[rows] + (squares.mean(dim=1) if self.widths is None
                                  else squares.sum(dim=1) / self.widths[rows])
        self.sums[rows] = sums
        self.weight.index_add_(0, rows, values * (-self.lr / (sums.sqrt() + self.eps))[:, None])


class Trainer:
    """The job's network over one embedding matrix, trained batch by batch from memory."""

    def __init__(self, job: Job, keys: int, widths: np.ndarray | None = None):
        t = job.train
        self.job, self.layout = job, job.layout()
        self.task_weights = task_weights(job)
        self.net = build_network(job)
        self.embedding = torch.nn.Embedding(keys, self.layout.row_dim, sparse=True)
        with torch.no_grad():   # the shards' initial rows' law, seeded with [train] seed
            self.embedding.weight.uniform_(-t.embedding_init, t.embedding_init,
                                           generator=torch.Generator().manual_seed(t.seed))
        self.inputs = SparseInputs(self.layout, torch.device("cpu"))
        self.dense_opt = dense_adam(list(self.net.parameters()), t.dense_lr)
        self.sparse_opt: torch.optim.Adagrad | RowwiseAdagrad = (
            RowwiseAdagrad(self.embedding.weight, t.embedding_lr, widths=widths)
            if t.embedding_optimizer == "rowwise_adagrad"
            else torch.optim.Adagrad(self.embedding.parameters(), lr=t.embedding_lr, eps=1e-10))
        # Adagrad's sparse step builds its tensors from a coalesced gradient: torch's warning
        # that it does not check them is about nothing here
        warnings.filterwarnings("ignore", message="Sparse invariant checks")

    def logits(self, rows: np.ndarray, dense: np.ndarray) -> torch.Tensor:
        layout, n = self.layout, len(rows)
        if layout.has_lists:
            slots = rows.astype(np.int64)
            slots[slots < 0] = PAD
            grid, _ = layout.grid(slots)
            lengths = layout.lengths(slots)
        else:   # one slot per field: the slots as they are where the grid is sample-major
            # (``SparseInputs``), else their transpose
            order = rows if layout.sample_major else rows.T
            grid = np.ascontiguousarray(order, dtype=np.int64).reshape(-1)
            lengths = np.zeros((n, 0), dtype=np.int32)
        flat = self.embedding(torch.from_numpy(grid))
        sparse, seq_lengths = self.inputs.inputs(flat, n, lengths)
        return network_logits(self.net, sparse, torch.from_numpy(dense), seq_lengths,
                              self.job.train.precision)

    def train(self, rows: np.ndarray, dense: np.ndarray, labels: np.ndarray,
              weights: np.ndarray) -> tuple[float, float]:
        w = torch.from_numpy(weights)
        loss = weighted_loss_sum(self.logits(rows, dense), torch.from_numpy(labels), w,
                                 self.task_weights)
        self.dense_opt.zero_grad()
        self.sparse_opt.zero_grad()
        (loss / w.sum().clamp_min(1e-12)).backward()
        self.dense_opt.step()
        self.sparse_opt.step()
        return float(loss.detach()), float(w.sum())

    def score(self, rows: np.ndarray, dense: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return scored(self.logits(rows, dense), logit_shift(self.job)).numpy()


def batches(order: np.ndarray, size: int) -> Iterator[np.ndarray]:
    for lo in range(0, len(order), size):
        yield order[lo:lo + size]


def train_preloaded(job: Job, threads: int = 0, started: float | None = None) -> dict:
    """Load, train every epoch, evaluate after each: the figures as ``zbus-reference`` gives
    them, with the time of each stage; ``started`` (``time.time()``): when the command began
    (end_to_end_s counts from it; from this call without it)."""
    began = time.time() if started is None else started
    t = job.train
    if t.batch_by_label:
        raise DataError("zbus-reference --preload shuffles with a permutation, which cannot "
                        "keep one label per batch: run it without [train] batch_by_label")
    threads = threads or os.cpu_count() or 1
    set_threads(threads)
    pa.set_cpu_count(threads)
    start = time.perf_counter()
    data = load(job, threads)
    load_s = time.perf_counter() - start
    trainer = Trainer(job, data.keys, data.widths)
    epochs, train_s, eval_s = [], 0.0, 0.0
    for epoch in range(t.epochs):
        start = time.perf_counter()
        order = np.random.default_rng([t.seed, epoch]).permutation(data.train) \
            if t.shuffle else np.arange(data.train)
        loss_sum = weight_sum = 0.0
        for b in batches(order, t.batch_size):
            loss, weight = trainer.train(data.rows[b], data.dense[b], data.labels[b],
                                         data.weights[b])
            loss_sum += loss
            weight_sum += weight
        train_s += time.perf_counter() - start
        start = time.perf_counter()
        scores = TaskScores(len(job.tasks))
        for lo in range(data.train, len(data.labels), t.eval_batch):
            hi = min(len(data.labels), lo + t.eval_batch)
            scores.add(data.labels[lo:hi], trainer.score(data.rows[lo:hi], data.dense[lo:hi]))
        eval_s += time.perf_counter() - start
        epochs.append({"epoch": epoch, "train_loss": loss_sum / weight_sum if weight_sum
                       else None, **scores.record(job.tasks), "train_samples": data.train})
    trained = data.train * t.epochs
    return {"auc": epochs[-1]["auc"] if epochs else None,
            "logloss": epochs[-1]["logloss"] if epochs else None,
            "tasks": epochs[-1]["tasks"] if epochs else {},
            "samples_trained": trained, "eval_samples": len(data.labels) - data.train,
            "rows_rejected": data.tally.rejected, "keys": data.keys, "threads": threads,
            "load_s": load_s, "load_stages_s": data.stages, "train_s": train_s, "eval_s": eval_s,
            "end_to_end_s": time.time() - began,
            "samples_per_s": trained / train_s if train_s else None,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "per_epoch": epochs}
