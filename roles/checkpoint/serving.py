"""A complete checkpoint read as a model to serve (``zbus-predict RUN_DIR/checkpoints``): so a
serving system can follow a long job, every checkpoint is also an export, in its own layout.

A checkpoint holds what scoring needs: the job (``job.toml``), the dense transform
(``transform.json``), the dense weights (``dense.npz``, flat, in the network's parameter
order) and each shard's rows (its chain: the last whole table and the changes since, read in
order by ``roles.checkpoint.shard.read_chain``, with its default rows when admission is on:
a key no shard holds scores with its field's default row, as in an export). ``LATEST`` in
the checkpoints directory names the newest complete one; a serving system polls it and loads
the checkpoint it names (a checkpoint stays on disk until ``[checkpoint] keep`` newer ones are
complete).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from roles.checkpoint.files import (
    CHECKPOINTS,
    DENSE_PART,
    LATEST,
    MANIFEST,
    read_manifest,
    read_meta,
)
from roles.checkpoint.shard import read_chain


@dataclass
class CheckpointModel:
    where: Path
    manifest: dict[str, Any]
    job_text: str
    transform: dict[str, Any]
    dense: np.ndarray               # flat, in the network's parameters() order
    tables: list[tuple[np.ndarray, np.ndarray]]   # per shard, in shard order: keys, rows
    defaults: list[np.ndarray | None]   # per shard: its default rows (admission), or None


def checkpoint_of(where: Path) -> Path | None:
    """The complete checkpoint ``where`` names: the checkpoint directory itself, a
    checkpoints directory or a run directory (their newest, by LATEST); None when ``where``
    names no checkpoint (an export, or nothing)."""
    for root in (where, where / CHECKPOINTS):
        latest = root / LATEST
        if latest.is_file():
            return root / latest.read_text().strip()
    if (where / MANIFEST).is_file() and where.parent.name == CHECKPOINTS:
        return where
    return None


def _shards(manifest: dict[str, Any]) -> list[tuple[int, list[str]]]:
    return sorted((int(node[3:]), files) for node, files in manifest["parts"].items()
                  if node.startswith("ps-"))


def chains(where: Path, manifest: dict[str, Any]) -> list[list[Path]]:
    """Each shard's chain of files (paths), in shard order."""
    return [[where.parent / name for name in files] for _, files in _shards(manifest)]


def chain_keys(chain: list[Path]) -> int:
    """The keys a shard's chain of files leaves (its newest file's count)."""
    with np.load(chain[-1]) as f:
        return int(read_meta(f)["keys"])


def chain_defaults(root: Path, files: list[str]) -> np.ndarray | None:
    """A shard's default rows as its chain leaves them (the newest file that has them)."""
    found = None
    for name in files:
        with np.load(root / name) as f:
            if "default_weights" in f.files:
                found = f["default_weights"]
    return found


def load_checkpoint_model(where: Path, rows: bool = True) -> CheckpointModel:
    """The model of a complete checkpoint (ValueError when it is not one); without ``rows``,
    its shards' rows are left out (``tables`` empty: ``chains`` says where they are), their
    default rows read."""
    manifest = read_manifest(where)
    if manifest is None:
        raise ValueError(f"{where} is not a complete checkpoint (no manifest, or a file it "
                         "lists is missing or of another size)")
    root = where.parent
    with np.load(where / DENSE_PART) as f:
        dense = f["params"].astype(np.float32)
    tables, defaults = [], []
    for _, files in _shards(manifest):
        if not rows:
            defaults.append(chain_defaults(root, files))
            continue
        got = read_chain(root, files)
        tables.append((got.keys, got.weights))
        defaults.append(got.default_weights)
    return CheckpointModel(where, manifest, (where / "job.toml").read_text(),
                           orjson.loads((where / "transform.json").read_bytes()), dense,
                           tables, defaults)
