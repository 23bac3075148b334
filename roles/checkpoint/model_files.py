"""The files that hold a model: dense-weight backups and the exported model (no sockets).

Backups (``runs/<run>/backups/dense-r<round>.npz``, numpy ``.npz``): ``params`` (the flat
float32 dense weights, in ``model.parameters()`` order) and ``meta`` (orjson bytes: round,
generation, relative change since the previous backup, unix time). Written atomically; the
newest ``backups_kept`` are kept.

The export (``runs/<run>/export/``), the hand-off to a serving system:

- ``dense.npz``: one array per named tensor of the dense network (``torch`` state-dict names,
  e.g. ``mlp.0.weight``), float32;
- ``embeddings-ps-<i>.npz``: ``keys`` (int64, the 64-bit feature ids, see
  ``roles.data.hashing``) and ``rows`` (float32 [keys, embedding_dim]) of shard i's table,
  ``rows[i]`` the row of ``keys[i]`` (in no particular order: a reader sorts or maps them;
  written streamed, ``save_embeddings``); with admission (``[embeddings] min_count`` > 1)
  also ``defaults`` (float32 [sparse fields, embedding_dim]), the shard's default row of each
  field. A key in no shard file has its field's default row of the shard that owns it by hash
  placement when the files have default rows, else its deterministic initial row
  (``roles.algorithms.shard.embedding_table``);
- ``transform.json``: the dense transform (log1p flag, training mean and std per column);
- ``job.toml``: the effective job (schema, model sizes, seed);
- ``manifest.json``, written last: the parts, the round and the AUC of the exported weights,
  and ``key_hash``, the function that made the keys (an export made with another is refused
  by ``zbus-predict``). An export without a manifest is incomplete.
"""

from __future__ import annotations

import io
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import orjson

from roles.algorithms.shard.key_index import KeyIndex
from roles.checkpoint.npz_stream import Entry, whole, write_npz
from roles.protocol.lifecycle import Export, Exported
from roles.storage.fs import is_uri
from roles.storage.store import Store
from zbus.files import atomic_write

MANIFEST = "manifest.json"
DENSE = "dense.npz"
TRANSFORM = "transform.json"
JOB = "job.toml"
CHUNK_BYTES = 32 << 20   # the most bytes of rows in one piece of a streamed embeddings file


def embeddings_file(shard: int) -> str:
    return f"embeddings-ps-{shard}.npz"


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    # allow_pickle given, as its default: else mypy checks the arrays against it too
    np.savez(buf, allow_pickle=True, **arrays)
    return buf.getvalue()


def _meta(meta: dict) -> np.ndarray:
    return np.frombuffer(orjson.dumps(meta), dtype=np.uint8)


def save_dense(path: Path, params: np.ndarray, meta: dict) -> None:
    atomic_write(path, npz_bytes(params=np.asarray(params, dtype=np.float32), meta=_meta(meta)))


def load_dense(path: Path) -> tuple[np.ndarray, dict]:
    with np.load(path) as f:
        return f["params"].astype(np.float32), orjson.loads(f["meta"].tobytes())


def relative_change(new: np.ndarray, old: np.ndarray) -> float:
    """||new - old|| / ||old|| (in float64; inf when old is all zero and new is not)."""
    diff = float(np.linalg.norm(new.astype(np.float64) - old.astype(np.float64)))
    base = float(np.linalg.norm(old.astype(np.float64)))
    if base == 0:
        return 0.0 if diff == 0 else float("inf")
    return diff / base


class Backups:
    """The backup rule: after an aggregation, back up when the weights changed by at least
    ``change_min`` (relative) since the last backup; keep the newest ``kept``."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.last: np.ndarray | None = None
        self.written = 0

    def existing(self) -> list[Path]:
        """Backups on disk, oldest first."""
        return sorted(self.dir.glob("dense-r*.npz"))

    def drop_after(self, round_: int) -> int:
        """Remove the backups of rounds after ``round_`` (a run gone back to a checkpoint will
        make those rounds again); how many."""
        later = [p for p in self.existing() if int(p.stem.split("-r")[-1]) > round_]
        for path in later:
            path.unlink(missing_ok=True)
        return len(later)

    def due(self, params: np.ndarray, change_min: float) -> tuple[bool, float]:
        if self.last is None:
            return True, float("inf")
        change = relative_change(params, self.last)
        return change >= change_min, change

    def write(self, params: np.ndarray, round_: int, generation: int, change: float,
              kept: int) -> Path:
        path = self.dir / f"dense-r{round_:08d}.npz"
        save_dense(path, params, {"round": round_, "generation": generation,
                                  "change": None if change == float("inf") else change,
                                  "time": time.time()})
        self.last = np.array(params, dtype=np.float32)
        self.written += 1
        for old in self.existing()[:-kept]:
            old.unlink(missing_ok=True)
        return path


def save_named(path: Path, tensors: dict[str, np.ndarray]) -> None:
    atomic_write(path, npz_bytes(**{k: np.asarray(v, dtype=np.float32)
                                    for k, v in tensors.items()}))


def load_named(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def save_embeddings(path: Path, index: KeyIndex, weights: np.ndarray,
                    defaults: np.ndarray | None = None, chunk: int | None = None) -> int:
    """Write a shard's table as ``embeddings-ps-<i>.npz``: ``keys`` (int64 [n]), the live keys
    of ``index``, ``rows`` (float32 [n, dim]), ``rows[i]`` the row of ``keys[i]``
    (``weights[row]`` of the row number the index gives it), and ``defaults`` (the default
    rows) when given; the bytes written. The keys come in the order of the index's slots (a
    hash order: neither sorted nor by row number); what pairs them is only the position.

    Streamed (``roles.checkpoint.npz_stream``): the index is walked ``chunk`` slots at a time, twice
    (the keys, then their rows gathered piece by piece), so memory grows by one piece, the
    live entries of ``chunk`` slots (at most ``chunk`` rows; the index is kept at most half
    full), not by a copy of the table; the default ``chunk`` keeps a piece's rows under
    ``CHUNK_BYTES``. The index and weights must not change while it writes (the shard exports
    from its own loop); ``n`` is ``len(index)``, and a walk that finds another number fails
    (no file written)."""
    dim = weights.shape[1]
    if chunk is None:
        chunk = max(1024, CHUNK_BYTES // max(1, dim * weights.itemsize))
    n, slots = len(index), index.capacity

    def walk() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for start in range(0, slots, chunk):
            _, keys, rows = index.live_slots(start, min(start + chunk, slots))
            yield keys, rows

    entries = [Entry("keys", np.dtype(np.int64), (n,), (k for k, _ in walk())),
               Entry("rows", np.dtype(np.float32), (n, dim), (weights[r] for _, r in walk()))]
    if defaults is not None:
        entries.append(whole("defaults", np.asarray(defaults, dtype=np.float32)))
    return write_npz(path, entries)


def load_embeddings(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as f:
        return f["keys"], f["rows"]


def load_default_rows(path: Path) -> np.ndarray | None:
    """The shard's default rows (one per sparse field; with ``[embeddings] min_count`` > 1),
    or None."""
    with np.load(path) as f:
        return f["defaults"] if "defaults" in f.files else None


def json_bytes(obj: dict) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)


def write_json(path: Path, obj: dict) -> None:
    atomic_write(path, json_bytes(obj))


class ExportAnswers:
    """A node's answers to control's Export (the command stands and is re-published): its part
    written once per request. ``write`` writes this node's part into the export directory and
    returns (part name, file names), or None when it cannot yet (the command comes again)."""

    def __init__(self, write: Callable[[Path], tuple[str, list[str]] | None],
                 report: Callable[[Exported], None]):
        self.write = write
        self.report = report
        self.answered = 0  # the newest request answered

    def handle(self, m: Export) -> None:
        """Write this node's part; into an object store (``m.dir`` a URI), written in a local
        temporary directory first and uploaded."""
        if m.request <= self.answered:
            return
        if not is_uri(m.dir):
            written = self.write(Path(m.dir))
        else:
            with tempfile.TemporaryDirectory(prefix="zbus-export-") as staging:
                written = self.write(Path(staging))
                if written is not None:
                    Store(m.dir, Path(staging)).publish(written[1])
        if written is not None:
            self.answered = m.request
            part, files = written
            self.report(Exported(request=m.request, part=part, files=files))
