"""The no-communication limit: the same model, optimisers and data trained in one process.

Embeddings live in one table over every key the data shows (the shards' table, created on
first sight, sparse Adagrad), the dense network trains with Adam, batches come from the same
streams as one feeder's (``roles.data``: the same statistics, parts, part order, shuffle
buffer and batches). Used by the throughput benchmark and as the quality reference.

``--preload`` trains the strong single process instead (``roles.tools.preload``): the data
loaded once into memory, embeddings as a sparse ``nn.Embedding`` with sparse Adagrad, batches
sliced from a permutation, all cores by default; its figures add the time to load, train and
evaluate, end to end from the command's start, and the peak RSS.

    zbus-reference [--job FILE] [--threads N] [--preload | --events FILE [--freeze-after N]]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import orjson
import psutil
import torch

from roles.algorithms.feeding.passes import FeedingPass
from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.algorithms.shared.dense_optimizer import dense_adam
from roles.algorithms.shared.metrics import TaskScores, oracle_aucs
from roles.data.index import DataError, Part
from roles.data.source import DataSource
from roles.data.stream import Preparer, Samples, Tally, eval_batches
from roles.feeder.streams import PartStreams
from roles.job.cli import integer, load_job_or_exit
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
from roles.model.row_sums import RowSums
from roles.model.sparse_input import SparseInputs
from roles.tools.preload import train_preloaded
from zbus.heap import keep_heap


class Reference:
    def __init__(self, job: Job):
        self.job = job
        t = job.train
        self.layout = job.layout()
        self.net = build_network(job)
        self.table = EmbeddingTable(self.layout.row_dim, t.embedding_init, t.embedding_lr,
                                    t.seed, rowwise=t.embedding_optimizer == "rowwise_adagrad")
        self.inputs = SparseInputs(self.layout, torch.device("cpu"))
        self.row_sums = RowSums(torch.device("cpu"))   # as a worker sums a row's gradients
        self.opt = dense_adam(list(self.net.parameters()), t.dense_lr)
        self.task_weights = task_weights(job)

    def grid(self, batch: Samples
             ) -> tuple[torch.Tensor, np.ndarray, np.ndarray, np.ndarray | None]:
        """The batch's grid of rows (``roles.job.fields``), the table rows of its distinct
        keys, each occurrence's index into them, and each distinct key's table's width where
        tables are narrower than the rows (else None)."""
        flat, bounds = self.layout.grid(batch.keys)
        at = self.layout.widths_at(np.arange(len(flat)), bounds)   # field-major, as the grid
        flat = self.inputs.sample_order(flat, len(batch))         # is where widths differ
        uniq, inverse = np.unique(flat, return_inverse=True)
        inverse = inverse.reshape(-1)
        rows = self.table.rows_for(uniq)
        widths = None
        if at is not None:   # a key is one table's: any of its occurrences says its width
            widths = np.empty(len(rows), np.float32)
            widths[inverse] = at
        return torch.from_numpy(self.table.weights[rows][inverse]), rows, inverse, widths

    def logits(self, batch: Samples, flat: torch.Tensor) -> torch.Tensor:
        sparse, lengths = self.inputs.inputs(flat, len(batch), self.layout.lengths(batch.keys))
        return network_logits(self.net, sparse, torch.from_numpy(batch.dense), lengths,
                              self.job.train.precision)

    def train(self, batch: Samples) -> tuple[float, float]:
        flat, rows, inverse, widths = self.grid(batch)
        flat.requires_grad_(True)
        w = torch.from_numpy(batch.weights)
        loss = weighted_loss_sum(self.logits(batch, flat), torch.from_numpy(batch.labels), w,
                                 self.task_weights)
        self.opt.zero_grad()
        (loss / w.sum().clamp_min(1e-12)).backward()
        self.opt.step()
        if flat.grad is None:
            raise RuntimeError("the backward pass left the embeddings no gradient")
        # each distinct key's gradient summed over its occurrences, in grid order (the same
        # bits as np.add.at, which took 40 % of a wide_deep step on a Criteo batch)
        grads = self.row_sums.sums(inverse, flat.grad, len(rows))
        self.table.adagrad(rows, grads, widths)
        return float(loss.detach()), float(w.sum())

    def score(self, batch: Samples) -> np.ndarray:
        with torch.no_grad():
            flat, _, _, _ = self.grid(batch)
            return scored(self.logits(batch, flat), logit_shift(self.job)).numpy()


def train_reference(job: Job, threads: int = 0) -> dict:
    set_threads(threads or os.cpu_count() or 1)
    source = DataSource(job)
    files, parts, _ = source.index()
    source.files = files
    ref = Reference(job)
    streams = PartStreams(job, source)
    training = [p.number for p in parts if not p.eval]
    try:
        epochs, train_s, trained = train_epochs(job, ref, source.preparer(parts), parts,
                                                streams, training)
    finally:
        streams.close()
    oracle = source.oracle_scores(parts)
    return {"auc": epochs[-1]["auc"], "logloss": epochs[-1]["logloss"],
            "tasks": epochs[-1]["tasks"],
            "oracle_auc": None if oracle is None else oracle_aucs(*oracle)[0],
            "samples_trained": trained,
            "train_s": train_s, "samples_per_s": trained / train_s if train_s else None,
            "keys": len(ref.table), "per_epoch": epochs}


def train_epochs(job: Job, ref: Reference, prepare: Preparer, parts: list[Part],
                 streams: PartStreams, training: list[int]) -> tuple[list[dict], float, int]:
    """Every epoch trained and evaluated: (per epoch, seconds training, samples trained)."""
    t = job.train
    epochs, train_s, trained = [], 0.0, 0
    for epoch in range(t.epochs):
        tally = Tally()
        start = time.perf_counter()
        loss_sum = weight_sum = 0.0
        pass_ = FeedingPass(epoch, False, [
            streams.training(parts[n], epoch, None, prepare, tally, lambda *_: None)
            for n in streams.order(training, epoch)], open=job.data.parts_open)
        while (taken := pass_.take()) is not None:
            loss, weight = ref.train(taken[1])
            loss_sum += loss
            weight_sum += weight
        train_s += time.perf_counter() - start
        trained += tally.samples
        scores = TaskScores(len(job.tasks))
        for part in (p for p in parts if p.eval):
            for batch in eval_batches(streams.blocks(part), prepare, Tally(), t.eval_batch):
                scores.add(batch.labels, ref.score(batch))
        epochs.append({"epoch": epoch, "train_loss": loss_sum / weight_sum if weight_sum
                       else None, **scores.record(job.tasks), "train_samples": tally.samples})
    return epochs, train_s, trained


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="zbus-reference", description=__doc__.splitlines()[0])
    parser.add_argument("--job", help="job file (default: ZBUS_JOB or the built-in job)")
    parser.add_argument("--threads", type=integer, default=0, help="torch threads (default: all)")
    parser.add_argument("--events", metavar="FILE",
                        help="a stream job's comparator: FILE's rows as its events, in file "
                        "order, each batch scored and then trained on in this process "
                        "(test-then-train; roles/tools/stream_reference.py)")
    parser.add_argument("--freeze-after", metavar="N", type=integer, default=0,
                        help="with --events: train on the first N events only, then score "
                        "the rest with the model as it is then (a model that stops learning: "
                        "what online training is measured against on drifting data)")
    parser.add_argument("--preload", action="store_true",
                        help="load the data into memory once and train from it (the strong "
                        "single process; --threads also caps its loading threads)")
    args = parser.parse_args(argv)
    job = load_job_or_exit(args.job, "reference")
    keep_heap()   # as every role does: the yardstick gets what the cluster gets
    try:
        if args.events:
            from roles.tools.stream_reference import score_then_train
            result = score_then_train(job, args.events, args.threads,
                                      freeze_after=args.freeze_after or None)
        elif args.preload:
            result = train_preloaded(job, args.threads, psutil.Process().create_time())
        else:
            result = train_reference(job, args.threads)
    except DataError as exc:   # a missing file or object, a bad row count: one line
        print(f"zbus reference: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
