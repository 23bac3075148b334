"""``zbus-predict EXPORT DATA``: score a CSV/TSV/Criteo file with an exported model, with no
cluster running (the format of an export is in ``roles.model.files``).

Rows are read with the job's schema (the label column is optional: without it the rows are
only scored); a row that does not parse is rejected and listed, as in training. Each accepted
row's sparse values are hashed to their keys, looked up in the exported embeddings (a key no
shard held gets its deterministic initial row, as a shard would give it), its dense values go
through the exported transform, and the dense network gives the click probability.
``--split eval`` scores only the job's held-out split (the last ``eval_fraction`` of the
accepted rows), which reproduces the job's eval AUC. Writes ``score`` (and ``label``) per
accepted row, in file order, as TSV to ``--out`` (or nowhere), and prints the figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import orjson
import torch

from roles.algorithms.embedding_table import initial_rows
from roles.algorithms.metrics import auc, logloss
from roles.data.dataset import split_point
from roles.data.hashing import hash_column
from roles.data.readers import DataError, Schema, read_table, resolve_paths
from roles.data.transforms import DenseTransform
from roles.job.settings import Job, JobError, parse_job
from roles.model.files import (
    DENSE,
    JOB,
    MANIFEST,
    TRANSFORM,
    embeddings_file,
    load_embeddings,
    load_named,
)
from roles.model.network import build_model

CHUNK = 65_536


class ExportError(ValueError):
    """An export that cannot be used (incomplete, or not matching its job)."""


class ExportedModel:
    def __init__(self, where: Path):
        if not (where / MANIFEST).exists():
            raise ExportError(f"{where} has no {MANIFEST}: not an export, or an incomplete one")
        self.manifest = orjson.loads((where / MANIFEST).read_bytes())
        try:
            self.job: Job = parse_job((where / JOB).read_text(), str(where / JOB), None, {})
        except (OSError, JobError) as exc:
            raise ExportError(f"cannot read the export's job: {exc}") from None
        t = orjson.loads((where / TRANSFORM).read_bytes())
        self.transform = DenseTransform(log1p=t["log1p"], mean=np.asarray(t["mean"]),
                                        std=np.asarray(t["std"]))
        self.net = build_model(self.job)
        tensors = {k: torch.from_numpy(v) for k, v in load_named(where / DENSE).items()}
        self.net.load_state_dict(tensors)
        self.net.eval()
        parts = [load_embeddings(where / embeddings_file(i))
                 for i in range(self.manifest["shards"])]
        keys = np.concatenate([k for k, _ in parts])
        rows = np.concatenate([r for _, r in parts])
        order = np.argsort(keys)
        self.keys, self.rows = keys[order], rows[order]

    def embeddings(self, keys: np.ndarray) -> np.ndarray:
        """Rows of the keys [n, fields] -> [n, fields, dim]."""
        flat = keys.reshape(-1)
        at = np.searchsorted(self.keys, flat).clip(0, max(len(self.keys) - 1, 0))
        found = self.keys[at] == flat if len(self.keys) else np.zeros(len(flat), dtype=bool)
        t = self.job.train
        out = np.empty((len(flat), self.job.model.embedding_dim), dtype=np.float32)
        out[found] = self.rows[at[found]]
        out[~found] = initial_rows(flat[~found], self.job.model.embedding_dim,
                                   t.embedding_init, t.seed)
        return out.reshape(*keys.shape, -1)

    def score(self, keys: np.ndarray, dense: np.ndarray) -> np.ndarray:
        scores = []
        with torch.no_grad():
            for lo in range(0, len(keys), CHUNK):
                emb = torch.from_numpy(self.embeddings(keys[lo:lo + CHUNK]))
                logits = self.net(emb, torch.from_numpy(dense[lo:lo + CHUNK]))
                scores.append(torch.sigmoid(logits).numpy())
        return np.concatenate(scores) if scores else np.zeros(0, dtype=np.float32)


def schema_of(job: Job, with_label: bool) -> Schema:
    d = job.data
    label = (d.label if d.source == "file" else "label") if with_label else ""
    return Schema(label=label, dense=job.dense_fields, sparse=job.sparse_fields,
                  positive=tuple(d.positive), negative=tuple(d.negative))


def predict(model: ExportedModel, data: str, fmt: str, split: str) -> dict:
    job = model.job
    try:
        table = read_table(resolve_paths(data), fmt, schema_of(job, True))
    except DataError as exc:
        if "label column" not in str(exc):
            raise
        table = read_table(resolve_paths(data), fmt, schema_of(job, False))
    n = len(table.labels)
    lo, hi = 0, n
    if split != "all":
        cut = split_point(n, job.data.eval_fraction)
        lo, hi = (cut, n) if split == "eval" else (0, cut)
    keys = np.empty((hi - lo, len(job.sparse_fields)), dtype=np.int64)
    for f, name in enumerate(job.sparse_fields):
        keys[:, f] = hash_column(name, table.sparse[lo:hi, f])
    scores = model.score(keys, model.transform.apply(table.dense[lo:hi]))
    labels = table.labels[lo:hi]
    labelled = bool(len(labels)) and not np.isnan(labels).any()
    return {"rows_read": table.rows_read, "rejected_rows": len(table.rejected),
            "rejected": table.rejected, "scored": len(scores), "scores": scores,
            "labels": labels if labelled else None,
            "auc": auc(labels, scores) if labelled else None,
            "logloss": logloss(labels, scores) if labelled else None}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="zbus-predict", description=__doc__.splitlines()[0])
    parser.add_argument("export", help="an export directory (runs/<run>/export)")
    parser.add_argument("data", help="file (or glob) to score, with the job's columns")
    parser.add_argument("--format", choices=("csv", "tsv", "criteo"),
                        help="default: the job's format")
    parser.add_argument("--split", choices=("all", "train", "eval"), default="all",
                        help="score every accepted row, or the job's train or eval split")
    parser.add_argument("--out", help="write score (and label) per accepted row as TSV")
    args = parser.parse_args(argv)
    try:
        model = ExportedModel(Path(args.export))
        result = predict(model, args.data, args.format or model.job.data.format, args.split)
    except (ExportError, DataError, OSError, KeyError) as exc:
        print(f"zbus predict: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.out:
        lines = ["score\tlabel" if result["labels"] is not None else "score"]
        if result["labels"] is not None:
            lines += [f"{s:.6f}\t{int(y)}" for s, y in zip(result["scores"], result["labels"],
                                                          strict=True)]
        else:
            lines += [f"{s:.6f}" for s in result["scores"]]
        Path(args.out).write_text("\n".join(lines) + "\n")
    for r in result["rejected"][:5]:
        print(f"zbus predict: rejected {r.file}:{r.line}: {r.reason}", file=sys.stderr)
    figures = {k: result[k] for k in ("rows_read", "rejected_rows", "scored", "auc",
                                      "logloss")}
    figures["exported_auc"] = model.manifest.get("auc")
    print(orjson.dumps(figures).decode())


if __name__ == "__main__":
    main()
