"""``zbus-predict EXPORT DATA``: score a file (or a glob, or a directory) of CSV, TSV, Criteo
or Parquet rows with an exported model, with no cluster running (the format of an export is in
``roles.checkpoint.model_files``).

Rows are read with the job's schema, chunk by chunk (``roles.data``: the memory does not grow
with the data); the label column is optional: without it the rows are only scored. A row that
does not parse is rejected and listed, as in training. Each accepted row's sparse values are
hashed to their keys, looked up in the exported embeddings (a key no shard held gets its
deterministic initial row, as a shard would give it; with admission, ``[embeddings] min_count``
above 1, its field's default row on the shard that owns it by hash placement), its dense values
go through the exported transform, and the dense network gives the click probability. ``--split
eval`` scores only the job's held-out split (the last ``eval_fraction`` of the rows), which
reproduces the job's eval AUC. Writes ``score`` (and ``label``) per accepted row, in file order,
as TSV to ``--out`` (or nowhere), and prints the figures in one line (``--json``: as one JSON
object). A job of several labels (``[data] labels``) scores each: ``score_<label>`` per label,
then the labels, and each label's figures (AUC, log loss, NE, calibration, over the rows that
have it). On a terminal, a progress bar on stderr shows the rows scored, their rate and the time
left (``--quiet``: none).

The model can also be a complete checkpoint of a job still running (a serving system following
it): ``zbus-predict runs/<run>/checkpoints DATA`` scores with the newest.

Exits 0 when the rows were scored, 2 when the export or the data cannot be read (a missing or
damaged file, a missing column: one line names it), 3 when more than the job's
``max_rejected_fraction`` of the rows were rejected (the figures are printed, the scores
written, and the first rejected rows listed on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

from roles.algorithms.shared.metrics import TaskScores
from roles.data.index import DataError, index_files, plan_parts, resolve_paths
from roles.data.readers import Rejected, Schema, read_part
from roles.data.stream import Preparer, Tally, eval_batches
from roles.job.settings import Job
from roles.serving.model import ExportedModel, ExportError, read_model
from roles.storage.fs import StorageError
from roles.tools.output import quiet_broken_pipe

CHUNK = 65_536
REJECTED_SHOWN = 5


def schema_of(job: Job, with_label: bool, weight: bool = False) -> Schema:
    """The job's columns; with ``with_label``, every label's (``Job.tasks``); with
    ``weight``, its ``[data] weight`` column (read and checked as the job reads it, so that
    the same rows are set aside)."""
    d = job.data
    tasks = job.tasks if with_label else [""]
    return Schema(label=tasks[0], more_labels=tuple(tasks[1:]), dense=job.dense_fields,
                  sparse=job.sparse_fields, lists=job.list_fields,
                  positive=tuple(d.positive), negative=tuple(d.negative),
                  weight=d.weight if weight else "")


def out_header(tasks: list[str], with_label: bool) -> str:
    """``--out``'s columns: ``score`` (and ``label``) for one label; for several, a score per
    label (``score_<label>``), then each label as read (empty where missing)."""
    if len(tasks) == 1:
        return "score\tlabel\n" if with_label else "score\n"
    return "\t".join([f"score_{t}" for t in tasks] + (tasks if with_label else [])) + "\n"


def out_lines(probs: np.ndarray, labels: np.ndarray, with_label: bool) -> str:
    """``--out``'s rows of a batch (``out_header``)."""
    if probs.ndim == 1:
        return "".join(f"{s:.6f}\t{int(y)}\n" if with_label else f"{s:.6f}\n"
                       for s, y in zip(probs.tolist(), labels.tolist(), strict=True))
    rows = []
    for p, y in zip(probs.tolist(), labels.tolist(), strict=True):
        cells = [f"{s:.6f}" for s in p]
        if with_label:
            cells += ["" if math.isnan(v) else str(int(v)) for v in y]
        rows.append("\t".join(cells) + "\n")
    return "".join(rows)


def predict(model: ExportedModel, data: str, fmt: str, split: str,
            out: Path | None = None,
            progress: Callable[[int, int], None] = lambda done, total: None) -> dict:
    """Score the rows; ``progress`` is told of the rows read so far and of the rows in all."""
    job = model.job
    files = index_files(resolve_paths(data, fmt, "DATA"), fmt)
    # every row: no split is needed (a file of one row is scored)
    parts, _ = plan_parts(files, job.data.eval_fraction if split != "all" else 0.0,
                          job.data.part_mb)
    if split != "all":
        parts = [p for p in parts if p.eval == (split == "eval")]
    columns = set(files[0].header) if files[0].header else None
    with_label = columns is None or all(t in columns for t in job.tasks)
    weight = bool(job.data.weight) and (columns is None or job.data.weight in columns)
    schema = schema_of(job, with_label, weight)
    prepare = Preparer(job.layout(), model.transform, None)
    tally, scores = Tally(), TaskScores(len(job.tasks))
    shown: list[Rejected] = []
    total = sum(p.rows for p in parts)
    with open(out, "w") if out is not None else contextlib.nullcontext() as sink:
        if sink is not None:
            sink.write(out_header(job.tasks, with_label))
        for part in parts:
            blocks = read_part(files, part, fmt, schema)
            for batch in eval_batches(_keeping(blocks, shown), prepare, tally, CHUNK):
                probs = model.score(batch.keys, batch.dense)
                if with_label:
                    scores.add(batch.labels, probs)
                if sink is not None:
                    sink.write(out_lines(probs, batch.labels, with_label))
                progress(tally.rows_read, total)
    figures = scores.record(job.tasks) if with_label and scores.rows else \
        {"auc": None, "logloss": None, "tasks": {}}
    return {"rows_read": tally.rows_read, "rejected_rows": tally.rejected,
            "rejected": shown, "scored": tally.samples, "auc": figures["auc"],
            "logloss": figures["logloss"], "tasks": figures["tasks"]}


def _keeping(blocks, shown: list[Rejected]):
    """The blocks, keeping their first rejected rows to show."""
    for block in blocks:
        shown.extend(block.rejected[:REJECTED_SHOWN - len(shown)])
        yield block


def figures_line(figures: dict) -> str:
    text = (f"zbus predict: {figures['rows_read']:,} rows read, {figures['rejected_rows']:,} "
            f"rejected, {figures['scored']:,} scored")
    tasks = figures.get("tasks") or {}
    if len(tasks) > 1:
        text += ": " + "; ".join(f"{t} auc {f['auc']:.4f}, logloss {f['logloss']:.4f}, "
                                 f"calibration {f['calibration']:.4f}"
                                 for t, f in tasks.items())
    elif figures["auc"] is not None:
        text += f": auc {figures['auc']:.4f}, logloss {figures['logloss']:.4f}"
    if figures.get("exported_auc") is not None:
        text += f" (the export's eval auc {figures['exported_auc']:.4f})"
    return text


@quiet_broken_pipe
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="zbus-predict", description=__doc__.replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="zbus-predict [options] EXPORT DATA")
    parser.add_argument("export", metavar="EXPORT",
                        help="an export directory (runs/<run>/export, or export-<n>), or a "
                             "checkpoint: its directory, or the run's checkpoints directory "
                             "or run directory (the newest complete one); any of them as an "
                             "s3:// URI too (copied to a temporary directory first)")
    parser.add_argument("data", metavar="DATA", help="a file, a glob or a directory to score, "
                                                     "with the job's columns")
    parser.add_argument("--format", choices=("csv", "tsv", "criteo", "parquet"),
                        help="the data's format (default: the job's)")
    parser.add_argument("--split", choices=("all", "train", "eval"), default="all",
                        help="score every row (default), or the job's training or eval split")
    parser.add_argument("--out", metavar="FILE",
                        help="write score (and label) per accepted row as TSV")
    parser.add_argument("--json", action="store_true",
                        help="print the figures as one JSON object")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--max-rows", type=int, default=0,
                        help="a model of more embedding rows is read from disk: its rows "
                             "copied to memory-mapped files under $TMPDIR (default 0: every "
                             "row held in memory)")
    args = parser.parse_args(argv)
    if args.max_rows < 0:
        parser.error("--max-rows must be 0 (no bound) or more")
    try:
        model = read_model(args.export, args.max_rows)
        with progress_bar(not args.quiet and sys.stderr.isatty()) as advance:
            result = predict(model, args.data, args.format or model.job.data.format,
                             args.split, Path(args.out) if args.out else None, advance)
    except (ExportError, DataError, OSError, KeyError, StorageError) as exc:
        print(f"zbus predict: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    for r in result["rejected"]:
        print(f"zbus predict: rejected {r.file}:{r.line}: {r.reason}", file=sys.stderr)
    figures = {k: result[k] for k in ("rows_read", "rejected_rows", "scored", "auc",
                                      "logloss", "tasks")}
    figures["exported_auc"] = model.manifest.get("auc")
    print(orjson.dumps(figures).decode() if args.json else figures_line(figures))
    sys.stdout.flush()
    limit = model.job.data.max_rejected_fraction
    if result["rows_read"] and result["rejected_rows"] > limit * result["rows_read"]:
        print(f"zbus predict: {result['rejected_rows']} of {result['rows_read']} rows rejected, "
              f"more than max_rejected_fraction = {limit}", file=sys.stderr)
        raise SystemExit(3)


@contextlib.contextmanager
def progress_bar(shown: bool):
    """A rich progress bar on stderr (rows read of all, their rate, the time left), as
    zbus-prepare's; yields the function ``predict`` tells of its progress."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    started = time.monotonic()
    with Progress(TextColumn("zbus-predict"), BarColumn(),
                  TextColumn("{task.completed:,.0f}/{task.fields[of]} rows"),
                  TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                  console=Console(stderr=True), disable=not shown) as bar:
        task = bar.add_task("score", total=None, rate="", of="?")

        def advance(done: int, total: int) -> None:
            rate = done / max(time.monotonic() - started, 1e-9)
            bar.update(task, completed=done, total=total, rate=f"{rate:,.0f} rows/s",
                       of=f"{total:,}")

        yield advance


if __name__ == "__main__":
    main()
