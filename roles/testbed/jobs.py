"""Jobs for tests and benchmarks: the shipped Adult job and data, job files for generated data,
the rows a small text file's split gives."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

from roles.data.index import index_files, plan_parts

REPO = Path(__file__).resolve().parents[2]   # the checkout: jobs/, data/
ADULT_JOB = REPO / "jobs" / "adult.toml"
ADULT_TRAIN_ROWS = 39074   # the Adult job's training split (the last 20 % of rows: eval)
# the same rows as a plain CSV (``adult_text``): the eval split begins at the first line start at
# or after the last 20 % of its bytes (``roles.data.index``), one row later than by rows
ADULT_TEXT_TRAIN_ROWS, ADULT_TEXT_EVAL_ROWS = 39075, 9767
SLOW = {"model__hidden": [512, 256]}  # Adult's epochs of seconds: long enough to kill mid-epoch


def text_split_rows(path: Path, fmt: str, eval_fraction: float = 0.2) -> tuple[int, int]:
    """The training and eval rows of a small plain text file as a job splits it (by bytes, at a
    line start: ``roles.data.index``), counted line by line."""
    parts, _ = plan_parts(index_files([str(path)], fmt), eval_fraction, 64)
    data = path.read_bytes()
    rows = [0, 0]
    for p in parts:
        rows[p.eval] += sum(1 for line in data[p.start:p.end].split(b"\n") if line.strip())
    return rows[0], rows[1]


def criteo_data(path: Path | str) -> str:
    """The ``[data]`` lines of a Criteo-layout file (``scripts/make_criteo.py``)."""
    return f'path = "{path}"\nformat = "criteo"'


def job_text(name: str, data: str, *, dim: int = 8, hidden: tuple[int, ...] = (64, 32),
             epochs: int = 1, batch_size: int = 1024, train: str = "", more: str = "") -> str:
    """A job file's text for generated data (2 workers, 2 shards, a fifth of the rows kept
    for evaluation): ``data``'s lines under ``[data]``, ``train``'s under ``[train]``, and
    ``more`` (further sections) at the end."""
    return (f'name = "{name}"\n[data]\neval_fraction = 0.2\n{data}\n'
            f"[model]\nembedding_dim = {dim}\nhidden = {list(hidden)}\n"
            f"[train]\nepochs = {epochs}\nbatch_size = {batch_size}\n{train}\n"
            f"[cluster]\nworkers = 2\nshards = 2\n{more}")


def adult_text(directory: Path) -> str:
    """The shipped Adult data as a plain CSV (a gzipped file is one part; a plain one is cut
    into parts that several feeders read): its path, for ``data__path``."""
    path = directory / "adult.csv"
    if not path.exists():
        path.write_bytes(gzip.decompress((REPO / "data" / "adult.csv.gz").read_bytes()))
    return str(path)


def adult_rows(n: int) -> list[dict[str, str]]:
    """The first ``n`` rows of the Adult file, as a serving request's raw values."""
    with gzip.open(REPO / "data" / "adult.csv.gz", "rt") as f:
        reader = csv.DictReader(f)
        return [next(reader) for _ in range(n)]
