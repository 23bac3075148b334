"""A trained model to score with, as ``zbus-predict`` and ``zbus-serve`` read it: an export
(``runs/<run>/export``, format in ``roles.checkpoint.model_files``) or a complete checkpoint of a
running or finished job (``roles.checkpoint.serving``), local or in an object store
(``fetched``: copied first). ``ExportedModel.score`` gives the click probability of prepared
samples (keys and transformed dense values); ``ExportedModel.prepare`` makes them of rows.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import torch

from roles.algorithms.shard.embedding_table import initial_rows
from roles.algorithms.shared.key_map import KeyMap
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
from roles.checkpoint.serving import chain_keys, chains, checkpoint_of, load_checkpoint_model
from roles.data.hashing import KEY_HASH
from roles.data.transforms import DenseTransform
from roles.job.fields import field_of
from roles.job.settings import Job, JobError, parse_job
from roles.model.network import build_network, logit_shift, scored
from roles.model.sparse_input import SparseInputs
from roles.serving.row_store import RowStore, keys_in
from roles.storage.fs import is_uri
from roles.storage.store import Store, basename, parent

Finder = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


class ExportError(ValueError):
    """An export that cannot be used (incomplete, or not matching its job)."""


class ExportedModel:
    """An export (``runs/<run>/export``), or a complete checkpoint of a running or finished job
    (its directory, the run's ``checkpoints`` directory or the run directory: the newest one;
    ``roles.checkpoint.serving``). ``max_rows`` (0: no bound): a model of more rows keeps them
    in a ``RowStore`` on disk, memory-mapped (``roles.serving.row_store``), not in memory."""

    def __init__(self, where: Path, max_rows: int = 0):
        self.max_rows = max_rows
        self.store: RowStore | None = None
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
        files = [where / embeddings_file(i) for i in range(self.manifest["shards"])]
        defaults = [load_default_rows(f) for f in files]
        if self._on_disk(files, self.job, keys_in(files)):
            for f in files:
                self._stored().add_export(f)
            self._tables([], defaults)
            return
        self._tables([load_embeddings(f) for f in files], defaults)

    def _on_disk(self, files: list[Path], job: Job, held: int) -> bool:
        """With ``max_rows``: the model holds more keys (``held``), and a store is made for
        what the files hold."""
        if not self.max_rows or held <= self.max_rows:
            return False
        self.store = RowStore(keys_in(files), job.layout().row_dim)
        return True

    def _stored(self) -> RowStore:
        assert self.store is not None
        return self.store

    def _from_checkpoint(self, where: Path) -> None:
        try:
            manifest = read_manifest(where) if self.max_rows else None
            chained = chains(where, manifest) if manifest is not None else []
            on_disk = manifest is not None and self._on_disk(
                [f for chain in chained for f in chain],
                self._job((where / "job.toml").read_text(), where / "job.toml"),
                sum(chain_keys(chain) for chain in chained))
            c = load_checkpoint_model(where, rows=not on_disk)
            for chain in chained if on_disk else []:
                self._stored().add_chain(chain)
        except (ValueError, KeyError, OSError) as exc:
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
        self.owners = KeyMap.hashed(len(defaults), self.job.placement.buckets_per_shard)
        # with a store, the rows on disk: ``keys`` and ``rows`` are its files' (in the order
        # written, a dropped key's row among them: ``find`` and ``held`` say which count)
        if self.store is not None:
            self.keys, self.rows = self.store.keys[:len(self.store)], \
                self.store.rows[:len(self.store)]
            return
        keys = np.concatenate([k for k, _ in parts]) if parts else np.zeros(0, np.int64)
        rows = np.concatenate([r.reshape(-1, dim) for _, r in parts]) if parts \
            else np.zeros((0, dim), np.float32)
        order = np.argsort(keys)
        self.keys, self.rows = keys[order], rows[order]

    @property
    def held(self) -> int:
        """The keys that have a row."""
        return self.store.held if self.store is not None else len(self.keys)

    def find(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether each key has a row, and its row (zero where it has none)."""
        if self.store is not None:
            return self.store.find(flat)
        out = np.zeros((len(flat), self.layout.row_dim), dtype=np.float32)
        if not len(self.keys):
            return np.zeros(len(flat), dtype=bool), out
        at = np.searchsorted(self.keys, flat).clip(0, len(self.keys) - 1)
        found = self.keys[at] == flat
        out[found] = self.rows[at[found]]
        return found, out

    def embeddings(self, keys: np.ndarray, find: Finder | None = None,
                   defaults: np.ndarray | None = None) -> np.ndarray:
        """The rows of a batch's keys (samples x slots) as its grid (``roles.job.fields``):
        [grid, row_dim]; ``find`` and ``defaults`` in place of this model's (a live version's,
        ``roles.serving.live``)."""
        flat, bounds = self.layout.grid(keys)
        found, out = (find or self.find)(flat)
        defaults = self.defaults if find is None else defaults
        if defaults is not None:
            missing = np.flatnonzero(~found)
            field = field_of(missing, bounds)
            out[missing] = defaults[self.owners.owner_of(flat[missing]), field]
        else:
            t = self.job.train
            out[~found] = initial_rows(flat[~found], self.layout.row_dim, t.embedding_init,
                                       t.seed)
        return out

    def score(self, keys: np.ndarray, dense: np.ndarray, net: torch.nn.Module | None = None,
              find: Finder | None = None, defaults: np.ndarray | None = None) -> np.ndarray:
        """Click probabilities (``[rows]``; ``[rows, labels]`` with several; negative
        down-sampling undone: ``roles.model.network.scored``); ``net``, ``find`` and
        ``defaults``: a live version's."""
        with torch.no_grad():
            grid = self.inputs.sample_order(self.embeddings(keys, find, defaults), len(keys))
            sparse, lengths = self.inputs.inputs(torch.from_numpy(grid), len(keys),
                                                 self.layout.lengths(keys))
            return scored((net or self.net)(sparse, torch.from_numpy(dense), lengths),
                          logit_shift(self.job)).numpy()


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


def read_model(where: str, max_rows: int = 0) -> ExportedModel:
    """The model at ``where``: a local path, or an ``s3://`` URI copied to a temporary
    directory first (removed once the model is read: its rows are held in memory, or copied
    to a ``RowStore`` beyond ``max_rows``)."""
    if not is_uri(where):
        return ExportedModel(Path(where).expanduser(), max_rows)
    with tempfile.TemporaryDirectory(prefix="zbus-model-") as copy:
        return ExportedModel(fetched(where, Path(copy)), max_rows)


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
