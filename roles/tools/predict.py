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
object). On a terminal, a progress bar on stderr shows the rows scored, their rate and the time
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
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import torch

from roles.algorithms.shard.embedding_table import initial_rows
from roles.algorithms.shared.key_map import KeyMap
from roles.algorithms.shared.metrics import ScoreHistogram
from roles.checkpoint.files import CHECKPOINTS, LATEST, read_manifest
from roles.checkpoint.model_files import (
    DENSE,
    JOB,
    MANIFEST,
    TRANSFORM,
    embeddings_file,
    load_default_rows,
    load_embeddings,
    load_named,
)
from roles.checkpoint.serving import checkpoint_of, load_checkpoint_model
from roles.data.hashing import KEY_HASH
from roles.data.index import DataError, index_files, plan_parts, resolve_paths
from roles.data.readers import Rejected, Schema, read_part
from roles.data.stream import Preparer, Tally, eval_batches
from roles.data.transforms import DenseTransform
from roles.job.fields import field_of
from roles.job.settings import Job, JobError, parse_job
from roles.model.network import build_network
from roles.model.sparse_input import SparseInputs
from roles.storage.fs import StorageError, is_uri
from roles.storage.store import Store, basename, parent
from roles.tools.output import quiet_broken_pipe

CHUNK = 65_536
REJECTED_SHOWN = 5


class ExportError(ValueError):
    """An export that cannot be used (incomplete, or not matching its job)."""


class ExportedModel:
    """An export (``runs/<run>/export``), or a complete checkpoint of a running or finished job
    (its directory, the run's ``checkpoints`` directory or the run directory: the newest one;
    ``roles.checkpoint.serving``)."""

    def __init__(self, where: Path):
        checkpoint = checkpoint_of(where)
        if checkpoint is not None:
            self._from_checkpoint(checkpoint)
            return
        if not (where / MANIFEST).exists():
            raise ExportError(not_a_model(where))
        self.manifest = orjson.loads((where / MANIFEST).read_bytes())
        self._check_hash(where)
        self.job = self._job((where / JOB).read_text(), where / JOB)
        self._transform(orjson.loads((where / TRANSFORM).read_bytes()))
        self.net = build_network(self.job)
        tensors = {k: torch.from_numpy(v) for k, v in load_named(where / DENSE).items()}
        self.net.load_state_dict(tensors)
        self.net.eval()
        shards = range(self.manifest["shards"])
        self._tables([load_embeddings(where / embeddings_file(i)) for i in shards],
                     [load_default_rows(where / embeddings_file(i)) for i in shards])

    def _from_checkpoint(self, where: Path) -> None:
        try:
            c = load_checkpoint_model(where)
        except (ValueError, KeyError) as exc:
            raise ExportError(str(exc)) from None
        self.manifest = c.manifest
        self._check_hash(where)
        self.job = self._job(c.job_text, where / "job.toml")
        self._transform(c.transform)
        self.net = build_network(self.job)
        if c.dense.shape != (sum(p.numel() for p in self.net.parameters()),):
            raise ExportError(f"{where}: {c.dense.size} dense weights, the job's network has "
                              "another number")
        torch.nn.utils.vector_to_parameters(torch.from_numpy(c.dense), self.net.parameters())
        self.net.eval()
        self._tables(c.tables, c.defaults)

    def _check_hash(self, where: Path) -> None:
        if self.manifest.get("key_hash") != KEY_HASH:
            raise ExportError(f"{where} was exported with keys hashed by "
                              f"{self.manifest.get('key_hash', 'zbus-key-v1')!r}; this zbus "
                              f"hashes with {KEY_HASH!r}: score it with the zbus that made it")

    @staticmethod
    def _job(text: str, path: Path) -> Job:
        try:
            return parse_job(text, str(path), None, {})
        except JobError as exc:
            raise ExportError(f"cannot read the export's job: {exc}") from None

    def _transform(self, t: dict) -> None:
        self.transform = DenseTransform(log1p=t["log1p"], mean=np.asarray(t["mean"]),
                                        std=np.asarray(t["std"]))

    def _tables(self, parts: list[tuple[np.ndarray, np.ndarray]],
                defaults: list[np.ndarray | None]) -> None:
        """Each shard's keys and rows, and its default rows (None without admission), in
        shard order."""
        self.layout = self.job.layout()
        self.inputs = SparseInputs(self.layout, torch.device("cpu"))
        dim = self.layout.row_dim
        # with admission, a key with no row had its field's default row on its shard
        present = [d for d in defaults if d is not None and len(d)]
        self.defaults = np.stack(present) if defaults and len(present) == len(defaults) \
            else None
        self.owners = KeyMap.hashed(len(parts), self.job.placement.buckets_per_shard)
        keys = np.concatenate([k for k, _ in parts]) if parts else np.zeros(0, np.int64)
        rows = np.concatenate([r.reshape(-1, dim) for _, r in parts]) if parts \
            else np.zeros((0, dim), np.float32)
        order = np.argsort(keys)
        self.keys, self.rows = keys[order], rows[order]

    def embeddings(self, keys: np.ndarray) -> np.ndarray:
        """The rows of a batch's keys (samples x slots) as its grid (``roles.job.fields``):
        [grid, row_dim]."""
        flat, bounds = self.layout.grid(keys)
        at = np.searchsorted(self.keys, flat).clip(0, max(len(self.keys) - 1, 0))
        found = self.keys[at] == flat if len(self.keys) else np.zeros(len(flat), dtype=bool)
        t = self.job.train
        out = np.empty((len(flat), self.layout.row_dim), dtype=np.float32)
        out[found] = self.rows[at[found]]
        if self.defaults is not None:
            missing = np.flatnonzero(~found)
            field = field_of(missing, bounds)
            out[missing] = self.defaults[self.owners.owner_of(flat[missing]), field]
        else:
            out[~found] = initial_rows(flat[~found], self.layout.row_dim, t.embedding_init,
                                       t.seed)
        return out

    def score(self, keys: np.ndarray, dense: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            grid = self.inputs.sample_order(self.embeddings(keys), len(keys))
            sparse, lengths = self.inputs.inputs(torch.from_numpy(grid), len(keys),
                                                 self.layout.lengths(keys))
            return torch.sigmoid(self.net(sparse, torch.from_numpy(dense), lengths)).numpy()


def not_a_model(where: Path) -> str:
    """Why ``where`` is neither an export nor a checkpoint, in words."""
    expected = ("an export (runs/<run>/export) or a run with a checkpoint (runs/<run>, "
                "runs/<run>/checkpoints)")
    if not where.exists():
        return f"{where} does not exist: EXPORT is {expected}"
    if not where.is_dir():
        return f"{where} is a file: EXPORT is {expected}"
    if where.name == CHECKPOINTS or (where / CHECKPOINTS).is_dir() \
            or (where / "config.toml").is_file():   # a run's directory
        export = where / "export"
        return f"{where} holds no complete checkpoint (no {CHECKPOINTS}/{LATEST})" + (
            f": score its export, {export}" if (export / MANIFEST).is_file() else "")
    return (f"{where} is neither an export (it has no {MANIFEST}: another directory, or an "
            f"export not finished) nor a run or checkpoint directory: EXPORT is {expected}")


def fetched(where: str, into: Path) -> Path:
    """A local copy of a model in an object store (``s3://...``), read as the local one would
    be: an export (every object under it), a checkpoint (the files its manifest lists, which
    may lie in older checkpoints' prefixes), or a checkpoints prefix (its newest complete
    checkpoint, by ``LATEST``)."""
    store = Store(where)
    if store.size(LATEST) is not None:   # a checkpoints prefix: its newest checkpoint
        number = store.read_bytes(LATEST).decode().strip()
        return _fetch_checkpoint(Store(where), number, into / CHECKPOINTS)
    if store.size(MANIFEST) is None:
        raise ExportError(f"{where} holds neither an export nor a checkpoint (no {MANIFEST} "
                          f"and no {LATEST}): EXPORT is an export's or a checkpoint's URI, or "
                          "a checkpoints prefix")
    if "parts" in orjson.loads(store.read_bytes(MANIFEST)):   # one checkpoint
        return _fetch_checkpoint(Store(parent(where)), basename(where), into / CHECKPOINTS)
    store.download(store.files(), into / "export")
    return into / "export"


def _fetch_checkpoint(root: Store, number: str, into: Path) -> Path:
    """Checkpoint ``number`` of a checkpoints store, copied into ``into`` (its manifest
    checked there as on the store)."""
    manifest = read_manifest(root.location(number))
    if manifest is None:
        raise ExportError(f"{root.location(number)} is not a complete checkpoint (no "
                          "manifest, or a file it lists is missing or of another size)")
    root.download([*manifest["sizes"], f"{number}/{MANIFEST}"], into)
    return into / number


def schema_of(job: Job, with_label: bool) -> Schema:
    d = job.data
    label = (d.label if d.source == "file" else "label") if with_label else ""
    return Schema(label=label, dense=job.dense_fields, sparse=job.sparse_fields,
                  lists=job.list_fields,
                  positive=tuple(d.positive), negative=tuple(d.negative))


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
    with_label = columns is None or schema_of(job, True).label in columns
    schema = schema_of(job, with_label)
    prepare = Preparer(job.layout(), model.transform, None)
    tally, scores = Tally(), ScoreHistogram()
    shown: list[Rejected] = []
    total = sum(p.rows for p in parts)
    with open(out, "w") if out is not None else contextlib.nullcontext() as sink:
        if sink is not None:
            sink.write("score\tlabel\n" if with_label else "score\n")
        for part in parts:
            blocks = read_part(files, part, fmt, schema)
            for batch in eval_batches(_keeping(blocks, shown), prepare, tally, CHUNK):
                probs = model.score(batch.keys, batch.dense)
                if with_label:
                    scores.add(batch.labels, probs)
                if sink is not None:
                    sink.write("".join(f"{s:.6f}\t{int(y)}\n" if with_label else f"{s:.6f}\n"
                                       for s, y in zip(probs.tolist(), batch.labels.tolist(),
                                                       strict=True)))
                progress(tally.rows_read, total)
    return {"rows_read": tally.rows_read, "rejected_rows": tally.rejected,
            "rejected": shown, "scored": tally.samples,
            "auc": scores.auc() if with_label and scores.samples else None,
            "logloss": scores.logloss() if with_label and scores.samples else None}


def _keeping(blocks, shown: list[Rejected]):
    """The blocks, keeping their first rejected rows to show."""
    for block in blocks:
        shown.extend(block.rejected[:REJECTED_SHOWN - len(shown)])
        yield block


def figures_line(figures: dict) -> str:
    text = (f"zbus predict: {figures['rows_read']:,} rows read, {figures['rejected_rows']:,} "
            f"rejected, {figures['scored']:,} scored")
    if figures["auc"] is not None:
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
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="zbus-model-") as copy:
            where = fetched(args.export, Path(copy)) if is_uri(args.export) \
                else Path(args.export).expanduser()
            model = ExportedModel(where)
        with progress_bar(not args.quiet and sys.stderr.isatty()) as advance:
            result = predict(model, args.data, args.format or model.job.data.format,
                             args.split, Path(args.out) if args.out else None, advance)
    except (ExportError, DataError, OSError, KeyError, StorageError) as exc:
        print(f"zbus predict: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    for r in result["rejected"]:
        print(f"zbus predict: rejected {r.file}:{r.line}: {r.reason}", file=sys.stderr)
    figures = {k: result[k] for k in ("rows_read", "rejected_rows", "scored", "auc",
                                      "logloss")}
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
