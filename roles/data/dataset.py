"""A job's data, ready to batch: keys, transformed dense features, labels, sample weights and
the split.

The eval split is the last ``eval_fraction`` of the accepted rows in file order (for synthetic
data, the latest rows in time); the dense transform is fitted on the training rows only. Time
decay, dropping and merging (``roles.data.weighting``) apply to the training rows; eval rows
keep weight 1, so that eval AUC and logloss mean what they always mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from roles.algorithms.metrics import auc
from roles.data.hashing import hash_column
from roles.data.readers import DataError, Rejected, Schema, read_table, resolve_paths
from roles.data.synthetic import generate
from roles.data.transforms import DenseTransform
from roles.data.weighting import weigh
from roles.job.settings import DECAY_UNITS, Job


@dataclass
class Dataset:
    fields: list[str]
    keys: np.ndarray          # int64 [rows, fields]
    dense: np.ndarray         # float32 [rows, dense]
    labels: np.ndarray        # float32 [rows]
    weights: np.ndarray       # float32 [rows]: decay x count (1 for eval rows)
    timestamps: np.ndarray | None
    n_train: int
    rows_read: int
    transform: DenseTransform
    rejected: list[Rejected] = field(default_factory=list)
    oracle_auc: float | None = None
    dropped_rows: int = 0     # training rows whose decayed weight fell below drop_below
    merged_rows: int = 0      # training rows merged into an identical one

    @property
    def n_eval(self) -> int:
        return len(self.labels) - self.n_train


def split_point(rows: int, eval_fraction: float) -> int:
    """How many of ``rows`` accepted rows are training rows (the rest, the last, are eval)."""
    n_eval = int(round(rows * eval_fraction))
    n_train = rows - n_eval
    if n_train < 1 or n_eval < 1:
        raise DataError(f"{rows} usable rows cannot be split into training and eval "
                        f"(eval_fraction = {eval_fraction})")
    return n_train


def load_dataset(job: Job) -> Dataset:
    data = job.data
    fields = job.sparse_fields
    if data.source == "synthetic":
        s = data.synthetic
        gen = generate(s.rows, s.vocab, s.dense, s.zipf, s.signal, s.days, s.seed)
        n_train = split_point(s.rows, data.eval_fraction)
        labels, raw_dense, values, stamps = gen.labels, gen.dense, gen.values, gen.timestamps
        oracle = auc(labels[n_train:], gen.probs[n_train:])
        rows_read, rejected = s.rows, []
    else:
        schema = Schema(label=data.label, dense=job.dense_fields, sparse=fields,
                        positive=tuple(data.positive), negative=tuple(data.negative),
                        timestamp=data.timestamp)
        table = read_table(resolve_paths(data.path), data.format, schema)
        rows_read, rejected = table.rows_read, table.rejected
        if rows_read and len(rejected) > data.max_rejected_fraction * rows_read:
            first = rejected[0]
            raise DataError(f"{len(rejected)} of {rows_read} rows rejected, more than "
                            f"max_rejected_fraction = {data.max_rejected_fraction}; does the "
                            f"schema match the data? First: {first.file}:{first.line}: "
                            f"{first.reason}")
        n_train = split_point(len(table.labels), data.eval_fraction)
        labels, raw_dense, values, stamps = (table.labels, table.dense, table.sparse,
                                             table.timestamps)
        oracle = None
    transform = DenseTransform.fit(raw_dense[:n_train], data.log1p)
    keys = np.empty(values.shape, dtype=np.int64)
    for f, name in enumerate(fields):
        keys[:, f] = hash_column(name, values[:, f])
    dense = transform.apply(raw_dense)
    labels = np.asarray(labels, dtype=np.float32)
    w = weigh(keys[:n_train], dense[:n_train], labels[:n_train],
              None if stamps is None else stamps[:n_train], base=data.decay_base,
              unit_s=DECAY_UNITS[data.decay_unit], drop_below=data.drop_below, merge=data.merge)
    if not len(w.rows):
        raise DataError(f"every training row was dropped: decayed weights below drop_below = "
                        f"{data.drop_below} (decay_base = {data.decay_base})")
    keep = np.concatenate([w.rows, np.arange(n_train, len(labels))])
    weights = np.concatenate([w.weights, np.ones(len(labels) - n_train, dtype=np.float32)])
    return Dataset(fields=fields, keys=keys[keep], dense=dense[keep], labels=labels[keep],
                   weights=weights, timestamps=None if stamps is None else stamps[keep],
                   n_train=len(w.rows), rows_read=rows_read, transform=transform,
                   rejected=rejected, oracle_auc=oracle, dropped_rows=w.dropped,
                   merged_rows=w.merged)
