"""The data's index: its files, how many rows each holds, and where to cut them into parts.

The index of a text file (csv, tsv, criteo) is its size, modification time, header and number of
lines, and *marks*: the byte offset and line number of a line start about every ``MARK_BYTES``
(or 1/256 of a smaller file; found while counting newlines, at disk speed). A gzipped file cannot
be cut: it is one part (two when the eval split falls inside it), read from its start. A Parquet
file's index is its row groups' row counts (from its metadata; nothing is read). The index of a
large data set is cached under ``[data] cache_dir``, keyed by every file's path, size and
modification time, so that a second run does not count again.

``plan_parts`` cuts the data into parts of about ``part_mb`` (whole row groups for Parquet)
along file order: the training rows first, then the eval rows, the last ``eval_fraction`` of
the data's rows in file order (or every row of ``eval_path``). A part is the unit a feeder reads
and control hands out: a byte range of a text file that begins and ends at line starts, a range
of rows of a Parquet file or a gzipped file, or a range of rows of the built-in generator.

A directory's data files are those named as its format's are (``DATA_PATTERNS``: ``*.csv`` for
csv, ...), so that a README beside them is not read as data.

A location is a local path or an object-store URI (``s3://bucket/key``, a file; ``s3://bucket/
prefix``, its "directory"; a glob in its last name), read through ``roles.storage.fs``: a
text file through a buffered reader whose large reads are ranged GETs (a part is a byte range
of the object, as of a file), a Parquet file's row groups a few coalesced GETs each. An object's
index is cached (locally, under ``cache_dir``) keyed by its URI, size and modification time. A
location that cannot be reached (no such bucket or object, credentials refused) is a
``DataError`` naming it and pyarrow's reason. A file that is plainly not what
its format says (gzip bytes in a plain text file, a text file named ``.gz``, an archive,
Parquet read as text, UTF-16 text, text read as Parquet) is a ``DataError`` that says so.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import gzip
import hashlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, NamedTuple

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from roles.storage import fs as storage
from zbus.files import atomic_write

MARK_BYTES = 16 << 20      # a line start is marked about every 16 MiB of a large text file,
MIN_MARK_BYTES = 64 << 10  # and 256 times in a smaller one, at least 64 KiB apart
SAMPLES = 8                # blocks an uncounted text file's rows are estimated from,
SAMPLE_BYTES = 256 << 10   # of this many bytes each, at spread offsets
LINE_SEEK_BYTES = 64 << 10  # read at a time looking for a line start
READ_BYTES = 16 << 20
GZIP_READ_BYTES = 1 << 20
INDEX_VERSION = 3
# a Parquet file's header is its top-level columns (a list column by its name, not its leaf's,
# "element"); version 4 of its cached index, so that no leaf names are read from a cache
PARQUET_INDEX_VERSION = 4
AUTO_PARTS = 64
Advance = Callable[[int], None]   # told how many more bytes of the files were read
CRITEO_COLUMNS = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
# the files of a directory that are data, by format (a README in it is not)
DATA_PATTERNS = {"csv": ("*.csv", "*.csv.gz"),
                 "tsv": ("*.tsv", "*.tsv.gz", "*.txt", "*.txt.gz"),
                 "criteo": ("*.tsv", "*.tsv.gz", "*.txt", "*.txt.gz", "day_[0-9]*"),
                 "parquet": ("*.parquet",)}
SNIFF_BYTES = 64 << 10   # a text file's first bytes, looked at for signs of another format
GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"
OTHER_MAGIC = {rb"PK\x03\x04": "a zip archive", rb"BZh[1-9]1AY&SY": "bzip2-compressed",
               rb"\xfd7zXZ\x00": "xz-compressed", rb"\x28\xb5\x2f\xfd": "zstd-compressed",
               rb"7z\xbc\xaf\x27\x1c": "a 7-Zip archive"}
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")   # (UTF-32's begin with one of these too)


class DataError(ValueError):
    """The data cannot be read as the job describes it (missing file or column, ...)."""


class Stat(NamedTuple):
    """What the index keeps of a file's or object's stat."""

    st_size: int
    st_mtime_ns: int


@contextlib.contextmanager
def storage_errors(location: str) -> Iterator[None]:
    """An object store's errors (no bucket, no object, credentials refused, the network) as a
    DataError naming the location and pyarrow's reason; a local path's errors as they are."""
    try:
        yield
    except storage.StorageError as exc:
        raise DataError(str(exc)) from None
    except OSError as exc:
        if not storage.is_uri(location):
            raise
        raise DataError(f"{location}: {storage.describe(exc)}") from None


def stat(path: str) -> Stat:
    """The size and modification time of a file or object (OSError or DataError when there is
    none)."""
    if not storage.is_uri(path):
        st = os.stat(path)
        return Stat(st.st_size, st.st_mtime_ns)
    with storage_errors(path):
        info = storage.file_info(path)
    if info.type != pafs.FileType.File:
        raise DataError(f"{path} does not exist")
    return Stat(info.size or 0, info.mtime_ns or 0)


def open_data(path: str) -> IO[bytes]:
    """A binary file over a local file (``open``) or an object (``roles.storage.fs``)."""
    with storage_errors(path):
        return storage.open_reader(path)  # type: ignore[no-any-return]


def parquet_file(path: str) -> pq.ParquetFile:
    """A Parquet file's reader: by its path on a local disk; an object through its bucket's
    filesystem, the columns of the row groups read fetched in a few coalesced, concurrent
    ranged GETs (``pre_buffer``; ``readers`` reads an object's row groups one at a time, so
    that no more than one is held)."""
    if not storage.is_uri(path):
        return pq.ParquetFile(path)
    with storage_errors(path):
        fs, where = storage.filesystem(path)
        return pq.ParquetFile(where, filesystem=fs, pre_buffer=True)


def parquet_schema(path: str) -> pa.Schema:
    if not storage.is_uri(path):
        return pq.read_schema(path)
    with storage_errors(path):
        fs, where = storage.filesystem(path)
        return pq.read_schema(where, filesystem=fs)


def cache_name(path: str) -> str:
    """A file's name in cache keys: its absolute path, or an object's URI."""
    return path if storage.is_uri(path) else os.path.abspath(path)


@dataclass(frozen=True)
class FileIndex:
    path: str
    size: int
    mtime_ns: int
    kind: str                  # text, gzip or parquet
    rows: int                  # data rows: lines after the header, or Parquet rows
    header: list[str] = field(default_factory=list)  # csv/tsv column names ([] otherwise)
    data_start: int = 0        # text: the byte offset of the first data line
    marks: list[list[int]] = field(default_factory=list)  # text: [byte offset, row] pairs;
    #                            parquet: [row group, first row] pairs
    counted: bool = True       # False: a plain text file not counted (``rows`` is an
    #                            estimate from a sample; parts are cut by bytes, no marks)


@dataclass(frozen=True)
class Part:
    """A part of the data: rows [first_row, first_row + rows) of file ``file`` (in file order;
    row 0 is the first data line), read at bytes [start, end) of a plain text file."""

    number: int
    file: int
    first_row: int
    rows: int
    start: int = 0
    end: int = 0
    eval: bool = False

    def as_list(self) -> list[int]:
        return [self.number, self.file, self.first_row, self.rows, self.start, self.end,
                int(self.eval)]

    @classmethod
    def of(cls, values: list[int]) -> Part:
        number, file, first_row, rows, start, end, is_eval = values
        return cls(number, file, first_row, rows, start, end, bool(is_eval))


def resolve_paths(path: str, fmt: str, what: str = "[data] path") -> list[str]:
    """A file, the data files of a directory (those named as ``fmt``'s files are,
    ``DATA_PATTERNS``: a README or a file of another format is not read as data), or every
    file a glob matches (sorted); ``~`` is the home directory. ``what`` names ``path`` in the
    errors. The same of an ``s3://`` URI: an object, a prefix's objects, or a glob in its last
    name."""
    uri = storage.is_uri(path)
    if uri:
        scheme, _, rest = path.partition("://")
        path = f"{scheme}://{rest.rstrip('/')}"
    else:
        path = os.path.expanduser(path)
    try:
        if any(c in path for c in "*?["):
            paths = _glob(path, what)
            if not paths:
                raise DataError(f"{what} {path!r} matches no {'object' if uri else 'file'}")
            return paths
        kind = _kind(path)
        if kind == "file":
            return [path]
        if kind != "directory":
            raise DataError(f"{what} {path!r} does not exist{_no_bucket(path)}")
        # a local directory as pathlib names it (no "./", no trailing "/")
        found = [(loc, i) for loc, i in storage.listing(path if uri else str(Path(path)))
                 if not i.base_name.startswith(".")]
    except storage.StorageError as exc:
        raise DataError(f"{what} {exc}") from None
    paths = [loc for loc, i in found if storage.is_file(i)
             and any(fnmatch.fnmatch(i.base_name, pattern) for pattern in DATA_PATTERNS[fmt])]
    if not paths:
        raise _no_data_file(what, path, fmt, [i.base_name + ("/" if storage.is_directory(i)
                                                             else "") for _, i in found])
    return paths


def _glob(pattern: str, what: str) -> list[str]:
    """The files a glob matches, sorted: on the local disk anywhere in the path, in an object
    store in its last name only."""
    if not storage.is_uri(pattern):
        return sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
    parent, _, name = pattern.rpartition("/")
    if "://" not in parent or any(c in parent for c in "*?["):
        raise DataError(f"{what} {pattern!r}: a URI's glob may only be in its last name")
    return [loc for loc, info in storage.listing(parent)
            if storage.is_file(info) and fnmatch.fnmatch(info.base_name, name)]


def _kind(path: str) -> str | None:
    """"file", "directory", or None when there is nothing at ``path`` (anything on the local
    disk that is not a directory is read as a file)."""
    if not storage.is_uri(path):
        return "directory" if os.path.isdir(path) else "file" if os.path.exists(path) else None
    info = storage.file_info(path)
    return "file" if storage.is_file(info) else "directory" if storage.is_directory(info) \
        else None


def _no_bucket(uri: str) -> str:
    """`` (there is no bucket ...)`` when a URI below a bucket names one that does not exist."""
    if not storage.is_uri(uri):
        return ""
    scheme, _, rest = uri.partition("://")
    bucket = rest.split("/", 1)[0]
    missing = storage.file_info(f"{scheme}://{bucket}").type == pafs.FileType.NotFound
    return f" (there is no bucket {bucket!r})" if missing and "/" in rest.strip("/") else ""


def _no_data_file(what: str, path: str, fmt: str, names: list[str]) -> DataError:
    held = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5
                                   else "") if names else "nothing"
    return DataError(f"{what} {path!r} is a directory with no {fmt} data file in it "
                     f"(looked for {', '.join(DATA_PATTERNS[fmt])}; found {held})")


def kind_of(path: str, fmt: str) -> str:
    if fmt == "parquet":
        return "parquet"
    return "gzip" if path.endswith(".gz") else "text"


def _sniff(path: str, head: bytes, fmt: str) -> None:
    """DataError when the first bytes of a text file show it is not ``fmt`` text: compressed,
    an archive, Parquet, or text in UTF-16/32 (a byte-order mark, or NULs in its first line)."""
    if head.startswith(GZIP_MAGIC):
        raise DataError(f"{path} is gzip-compressed: name it {os.path.basename(path)}.gz "
                        "(a .gz file is read as gzip)")
    if head.startswith(PARQUET_MAGIC):
        raise DataError(f"{path} is a Parquet file, not {fmt} text: read it with format "
                        "\"parquet\"")
    for magic, what in OTHER_MAGIC.items():
        if re.match(magic, head):
            raise DataError(f"{path} is {what}: unpack it (zbus reads {fmt} text, plain or "
                            "gzipped)")
    first = head.split(b"\n", 1)[0]
    if head.startswith(UTF16_BOMS) or first.count(b"\0") * 4 >= max(len(first), 1):
        raise DataError(f"{path} is not UTF-8 text (UTF-16 or 32, or binary): convert it to "
                        "UTF-8")


def _split_header(line: bytes, fmt: str) -> list[str]:
    text = line.decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r\n")
    sep = "," if fmt == "csv" else "\t"
    return [c.strip().strip('"') for c in text.split(sep)]


def _nothing(_bytes: int) -> None:
    pass


def _text_header(path: str, f: IO[bytes], fmt: str) -> tuple[list[str], int]:
    """A text file's header (none for criteo) and the byte its data starts at, the file
    checked for signs of another format first; ``f`` is left at the data's start."""
    _sniff(path, f.read(SNIFF_BYTES), fmt)
    f.seek(0)
    if fmt == "criteo":
        return [], 0
    first = f.readline()
    if not first:
        raise DataError(f"{path} is empty (a header row is expected)")
    return _split_header(first, fmt), len(first)


def _index_text(path: str, fmt: str, stat: Stat,
                advance: Advance = _nothing) -> FileIndex:
    with open_data(path) as f:
        header, data_start = _text_header(path, f, fmt)
        marks = [[data_start, 0]]
        every = min(MARK_BYTES, max(MIN_MARK_BYTES, stat.st_size // 256))
        rows, at, next_mark, last = 0, data_start, data_start + every, b"\n"
        while chunk := f.read(READ_BYTES):
            while at + len(chunk) > next_mark:   # the first line start at or after next_mark
                cut = chunk.find(b"\n", max(0, next_mark - at - 1))
                if cut < 0 or at + cut + 1 >= stat.st_size:
                    break
                marks.append([at + cut + 1, rows + chunk.count(b"\n", 0, cut + 1)])
                next_mark = at + cut + 1 + every
            rows += chunk.count(b"\n")
            at += len(chunk)
            last = chunk[-1:]
            advance(len(chunk))
        if at > data_start and last != b"\n":
            rows += 1  # a last line without its newline
    return FileIndex(path, stat.st_size, stat.st_mtime_ns, "text", rows, header, data_start,
                     marks)


def _index_text_sampled(path: str, fmt: str, stat: Stat) -> FileIndex:
    """A plain text file's index without a pass: its header, where its data starts, and its
    rows estimated from ``SAMPLES`` blocks of ``SAMPLE_BYTES`` at spread offsets (their
    bytes per line; counted, when the file holds no more than those blocks); nothing else is
    read."""
    with open_data(path) as f:
        header, data_start = _text_header(path, f, fmt)
        data = stat.st_size - data_start
        if data <= SAMPLES * SAMPLE_BYTES:   # a small file is read whole: its rows are exact
            whole = f.read()
            rows = whole.count(b"\n") + (1 if whole and not whole.endswith(b"\n") else 0)
        else:
            lines = sampled = 0
            for k in range(SAMPLES):
                f.seek(data_start + k * (data // SAMPLES))
                block = f.read(SAMPLE_BYTES)
                if k:  # from the first line start in the block
                    block = block[block.find(b"\n") + 1:]
                block = block[:block.rfind(b"\n") + 1]   # to its last whole line
                lines += block.count(b"\n")
                sampled += len(block)
            rows = max(1, round(data * lines / sampled)) if lines else max(
                1, data // max(1, SAMPLE_BYTES))
    return FileIndex(path, stat.st_size, stat.st_mtime_ns, "text", rows, header, data_start,
                     [], counted=False)


def _index_gzip(path: str, fmt: str, stat: Stat,
                advance: Advance = _nothing) -> FileIndex:
    header: list[str] = []
    rows, last, first, consumed = 0, b"\n", True, 0
    with open_data(path) as raw:
        magic = raw.read(len(GZIP_MAGIC))
    if magic and magic != GZIP_MAGIC:
        raise DataError(f"{path} is not gzip-compressed, though its name ends in .gz: "
                        "compress it (gzip) or drop .gz from its name")
    try:
        with open_data(path) as raw, gzip.GzipFile(fileobj=raw, mode="rb") as f:
            while chunk := f.read(GZIP_READ_BYTES):  # small: the rows before damage count
                advance(raw.tell() - consumed)   # compressed bytes: the file's size is known
                consumed = raw.tell()
                if first:
                    _sniff(path, chunk[:SNIFF_BYTES], fmt)
                if first and fmt != "criteo":
                    cut = chunk.find(b"\n")
                    head = chunk if cut < 0 else chunk[:cut + 1]
                    header = _split_header(head, fmt)
                    chunk = chunk[len(head):]
                first = False
                rows += chunk.count(b"\n")
                if chunk:
                    last = chunk[-1:]
    except (EOFError, OSError, gzip.BadGzipFile) as exc:
        raise DataError(f"{path} is damaged ({exc}) after at least {rows} rows; restore or "
                        "recompress it") from None
    if first and fmt != "criteo":
        raise DataError(f"{path} is empty (a header row is expected)")
    if last != b"\n":
        rows += 1
    return FileIndex(path, stat.st_size, stat.st_mtime_ns, "gzip", rows, header)


def _index_parquet(path: str, stat: Stat) -> FileIndex:
    try:
        meta = parquet_file(path).metadata
    except DataError:
        raise
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError for a bad file
        with open_data(path) as f:
            head = f.read(SNIFF_BYTES)
        if head.startswith(GZIP_MAGIC) or (head and b"\0" not in head
                                            and not head.startswith(PARQUET_MAGIC)):
            line = head.split(b"\n", 1)[0][:60].decode("utf-8", errors="replace")
            what = "gzip-compressed" if head.startswith(GZIP_MAGIC) else f"text ({line!r}...)"
            raise DataError(f"{path} is {what}, not Parquet: name its format (csv, tsv or "
                            "criteo)") from None
        raise DataError(f"{path} is not a readable Parquet file: {exc}") from None
    marks, row = [], 0
    for g in range(meta.num_row_groups):
        marks.append([g, row])
        row += meta.row_group(g).num_rows
    return FileIndex(path, stat.st_size, stat.st_mtime_ns, "parquet", row,
                     list(meta.schema.to_arrow_schema().names), 0, marks)


def index_file(path: str, fmt: str, advance: Advance = _nothing,
               count_text: bool = True) -> FileIndex:
    """A file's index; a plain text file's lines counted only with ``count_text``."""
    st = stat(path)
    kind = kind_of(path, fmt)
    with storage_errors(path):
        if kind == "parquet":
            index = _index_parquet(path, st)
            advance(st.st_size)
            return index
        if kind == "gzip":
            return _index_gzip(path, fmt, st, advance)
        if not count_text:
            index = _index_text_sampled(path, fmt, st)
            advance(st.st_size)
            return index
        return _index_text(path, fmt, st, advance)


def by_bytes(paths: list[str], fmt: str) -> bool:
    """Whether data of these files is split and cut by bytes: every file plain text (a
    gzipped file cannot be cut, and Parquet's rows are known from its metadata)."""
    return bool(paths) and all(kind_of(p, fmt) == "text" for p in paths)


def index_files(paths: list[str], fmt: str, cache_dir: Path | None = None,
                advance: Advance = _nothing) -> list[FileIndex]:
    """The index of every file (from the cache when every file is as it was); ``advance`` is
    told of the bytes read as it goes (the files' sizes add up to the whole). Files that are
    all plain text (``by_bytes``) are not counted, nor cached (each index reads a few
    blocks): their data is split and cut by bytes."""
    if by_bytes(paths, fmt):
        return [index_file(p, fmt, advance, count_text=False) for p in paths]
    stats = [stat(p) for p in paths]
    version = PARQUET_INDEX_VERSION if fmt == "parquet" else INDEX_VERSION
    key = hashlib.sha256(orjson.dumps([version, fmt, [
        [cache_name(p), s.st_size, s.st_mtime_ns] for p, s in zip(paths, stats,
                                                                   strict=True)]])
    ).hexdigest()[:24]
    cached = cache_dir / f"index-{key}.json" if cache_dir is not None else None
    if cached is not None and cached.exists():
        try:
            return [FileIndex(**f) for f in orjson.loads(cached.read_bytes())]
        except (orjson.JSONDecodeError, TypeError):
            pass  # a damaged cache entry is simply made again
    index = [index_file(p, fmt, advance) for p in paths]
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cached, orjson.dumps([asdict(f) for f in index]), durable=False)
    return index


def _line_start(path: str, offset: int, row: int, target: int) -> int:
    """The byte offset of data row ``target``, counting lines on from a line start at
    ``offset`` that holds row ``row``."""
    with storage_errors(path), open_data(path) as f:
        f.seek(offset)
        while row < target:
            chunk = f.read(READ_BYTES)
            if not chunk:
                break
            lines = chunk.count(b"\n")
            if row + lines < target:
                row, offset = row + lines, offset + len(chunk)
                continue
            at = -1
            for _ in range(target - row):
                at = chunk.find(b"\n", at + 1)
            return offset + at + 1
    return offset


def _text_cuts(f: FileIndex, lo: int, hi: int, part_bytes: int) -> list[tuple[int, int]]:
    """(byte offset, row) cut points of rows [lo, hi) of a text file, at marks about
    ``part_bytes`` apart; the first and last at rows lo and hi exactly."""
    def at_row(row: int) -> int:
        if row >= f.rows:
            return f.size
        mark = max((m for m in f.marks if m[1] <= row), key=lambda m: m[1])
        return mark[0] if mark[1] == row else _line_start(f.path, mark[0], mark[1], row)

    cuts = [(at_row(lo), lo)]
    for offset, row in f.marks:
        if lo < row < hi and offset - cuts[-1][0] >= part_bytes:
            cuts.append((offset, row))
    end = (at_row(hi), hi)
    if len(cuts) > 1 and end[0] - cuts[-1][0] < part_bytes // 4:
        cuts.pop()  # no short last part: fold it into the one before
    return [*cuts, end]


def _parquet_cuts(f: FileIndex, lo: int, hi: int, part_rows: int) -> list[int]:
    rows = [lo]
    for _, first in f.marks:
        if lo < first < hi and first - rows[-1] >= part_rows:
            rows.append(first)
    return [*rows, hi]


def auto_part_bytes(files: list[FileIndex]) -> int:
    """Parts of the data's size / ``AUTO_PARTS``, within 4 to 64 MiB: enough parts to share
    among feeders and to read in a new order every epoch, none too small to read well."""
    total = sum(f.size for f in files)
    return int(min(64 << 20, max(4 << 20, total // AUTO_PARTS)))


def _line_start_at(f: IO[bytes], offset: int, size: int) -> int:
    """The first line start at or after ``offset`` (> 0) of an open file of ``size`` bytes
    (``size`` when none is left): found by reading forward from the byte before it."""
    at = offset - 1
    f.seek(at)
    while chunk := f.read(LINE_SEEK_BYTES):
        cut = chunk.find(b"\n")
        if cut >= 0:
            return min(size, at + cut + 1)
        at += len(chunk)
    return size


def _byte_cuts(src: IO[bytes], f: FileIndex, a: int, b: int, part_bytes: int) -> list[int]:
    """Byte offsets that cut bytes [a, b) of a text file (both line starts) into parts of
    about ``part_bytes``, each at a line start found by seeking; the last no shorter than a
    quarter of ``part_bytes`` (folded into the one before)."""
    cuts = [a]
    while cuts[-1] + part_bytes < b:
        cut = _line_start_at(src, cuts[-1] + part_bytes, f.size)
        if cut >= b:
            break
        cuts.append(cut)
    if len(cuts) > 1 and b - cuts[-1] < part_bytes // 4:
        cuts.pop()  # no short last part: fold it into the one before
    return [*cuts, b]


def _about_rows(f: FileIndex, start: int, end: int) -> int:
    """The estimated rows of bytes [start, end) of an uncounted text file (at least one when
    it holds a byte)."""
    data = f.size - f.data_start
    if end <= start or data <= 0:
        return 0
    return max(1, round((end - start) * f.rows / data))


def _byte_split(files: list[FileIndex], eval_fraction: float
                ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The training and eval byte ranges ([start, end) of each file, by file) of uncounted
    text files: the eval split is the last ``eval_fraction`` of the data's bytes (the files'
    bytes after their headers, in file order), from the first line start at or after that
    point."""
    total = sum(f.size - f.data_start for f in files)
    point = round(total * (1.0 - eval_fraction))
    train, evaluation, before = [], [], 0
    for f in files:
        data = f.size - f.data_start
        if point >= before + data:
            cut = f.size
        elif point <= before:
            cut = f.data_start
        else:
            with storage_errors(f.path), open_data(f.path) as src:
                cut = _line_start_at(src, f.data_start + point - before, f.size)
        train.append((f.data_start, cut))
        evaluation.append((cut, f.size))
        before += data
    return train, evaluation


def plan_parts(files: list[FileIndex], eval_fraction: float, part_mb: float,
               eval_files: list[FileIndex] | None = None) -> tuple[list[Part], int]:
    """The parts of the data in file order (training parts, then eval parts), and the number of
    training rows. Counted files (gzipped text, Parquet, or text among them): the eval rows are
    the last ``eval_fraction`` of the data's rows in file order. Uncounted files (plain text
    only, ``by_bytes``): the eval rows are those from the first line start at or after the
    last ``eval_fraction`` of the data's bytes (after the headers), and the parts' rows, their
    first rows and the training rows are estimates (``FileIndex.counted``). None with 0
    (``zbus-predict`` scoring every row); every row of ``eval_files`` when given."""
    part_bytes = max(1, int(part_mb * (1 << 20))) if part_mb > 0 else auto_part_bytes(
        files + (eval_files or []))
    parts: list[Part] = []
    if eval_files is None and files and not any(f.counted for f in files):
        train, evaluation = _byte_split(files, eval_fraction)
        n_train = sum(_about_rows(f, a, b) for f, (a, b) in zip(files, train, strict=True))
        n_eval = sum(_about_rows(f, a, b) for f, (a, b) in zip(files, evaluation,
                                                              strict=True))
        if n_train < 1 or (n_eval < 1 and eval_fraction > 0):
            raise DataError(f"{_rows_in(files)}: too few to split into training and eval "
                            f"(eval_fraction = {eval_fraction})")
        for ranges, is_eval in ((train, False), (evaluation, True)):
            _byte_parts(parts, files, ranges, 0, part_bytes, is_eval)
        return parts, n_train
    total = sum(f.rows for f in files)
    if eval_files is None:
        n_eval = int(round(total * eval_fraction))
        n_train = total - n_eval
        if n_train < 1 or (n_eval < 1 and eval_fraction > 0):
            raise DataError(f"{_rows_in(files)}: too few to split into training and eval "
                            f"(eval_fraction = {eval_fraction})")
        regions = [(files, 0, n_train, False), (files, n_train, total, True)]
    else:
        n_train = total
        if not total:
            raise DataError(f"{_rows_in(files)}: no row to train on")
        if not sum(f.rows for f in eval_files):
            raise DataError(f"{_rows_in(eval_files)}: no row to evaluate on ([data] eval_path)")
        regions = [(files, 0, total, False),
                   (eval_files, 0, sum(f.rows for f in eval_files), True)]
    offset_files = 0
    for group, lo, hi, is_eval in regions:
        if is_eval and eval_files is not None:
            offset_files = len(files)
        at = 0
        for i, f in enumerate(group):
            a, b = max(lo, at) - at, min(hi, at + f.rows) - at
            at += f.rows
            if a >= b:
                continue
            number = offset_files + i
            if not f.counted:   # a whole uncounted text file (of files or eval_files)
                _byte_parts(parts, [f], [(f.data_start, f.size)], number, part_bytes, is_eval)
            elif f.kind == "text":
                text_cuts = _text_cuts(f, a, b, part_bytes)
                for (s, r0), (e, r1) in zip(text_cuts, text_cuts[1:], strict=False):
                    parts.append(Part(len(parts), number, r0, r1 - r0, s, e, is_eval))
            elif f.kind == "parquet":
                rows_per = max(1, int(part_bytes / max(1.0, f.size / max(f.rows, 1))))
                row_cuts = _parquet_cuts(f, a, b, rows_per)
                for r0, r1 in zip(row_cuts, row_cuts[1:], strict=False):
                    parts.append(Part(len(parts), number, r0, r1 - r0, eval=is_eval))
            else:
                parts.append(Part(len(parts), number, a, b - a, eval=is_eval))
    return parts, n_train


def _byte_parts(parts: list[Part], files: list[FileIndex], ranges: list[tuple[int, int]],
                first_number: int, part_bytes: int, is_eval: bool) -> None:
    """Parts of byte ranges ([start, end) of each of ``files``, file ``first_number`` on) of
    uncounted text files, appended to ``parts``; their rows and first rows estimated."""
    for i, (f, (a, b)) in enumerate(zip(files, ranges, strict=True)):
        if a >= b:
            continue
        with storage_errors(f.path), open_data(f.path) as src:
            cuts = _byte_cuts(src, f, a, b, part_bytes)
        for s, e in zip(cuts, cuts[1:], strict=False):
            parts.append(Part(len(parts), first_number + i, _about_rows(f, f.data_start, s),
                              _about_rows(f, s, e), s, e, is_eval))


def exact_rows(f: FileIndex) -> bool:
    """Whether ``f.rows`` is exact: a counted file, or a small uncounted one (read whole)."""
    return f.counted or f.size - f.data_start <= SAMPLES * SAMPLE_BYTES


def _rows_in(files: list[FileIndex]) -> str:
    """``data.csv holds 0 rows after its header``, or ``the 3 files (a.csv, ...) hold 1 row``."""
    total = sum(f.rows for f in files)
    rows = ("" if all(exact_rows(f) for f in files) else "about ") + f"{total} row" + (
        "" if total == 1 else "s")
    if len(files) == 1:
        after = " after its header" if files[0].header and files[0].kind != "parquet" else ""
        return f"{files[0].path} holds {rows}{after}"
    names = ", ".join(os.path.basename(f.path) for f in files[:3])
    return f"the {len(files)} files ({names}{', ...' if len(files) > 3 else ''}) hold {rows}"


def synthetic_parts(rows: int, eval_fraction: float, part_rows: int) -> tuple[list[Part], int]:
    """Parts of the built-in generator's rows: the last ``eval_fraction`` are the eval rows."""
    n_eval = int(round(rows * eval_fraction))
    n_train = rows - n_eval
    if n_train < 1 or n_eval < 1:
        raise DataError(f"{rows} rows cannot be split into training and eval "
                        f"(eval_fraction = {eval_fraction})")
    parts: list[Part] = []
    for lo, hi, is_eval in ((0, n_train, False), (n_train, rows, True)):
        for a in range(lo, hi, part_rows):
            parts.append(Part(len(parts), 0, a, min(hi, a + part_rows) - a, eval=is_eval))
    return parts, n_train
