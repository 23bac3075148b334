"""Local paths and object-store URIs behind one interface: pyarrow's filesystems.

A location is a local path (``/data/day1.tsv``, ``runs/x``) or a URI that pyarrow knows
(``s3://bucket/prefix``; ``file://`` too). S3 follows the AWS conventions, as pyarrow's
``S3FileSystem`` reads them: credentials from ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` (or a profile, ``AWS_PROFILE``), the region from
``AWS_DEFAULT_REGION`` / ``AWS_REGION``, and an S3-compatible store's endpoint from
``AWS_ENDPOINT_URL``.

Objects in a store are written whole or not at all (an object exists once its upload
completes), but nothing renames atomically: code that needs "complete" writes a marker object
last (``roles.checkpoint.files``: a checkpoint's manifest).
"""

from __future__ import annotations

import functools
import os
import posixpath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow.fs as pafs

URI_SCHEMES = ("s3://",)


class StorageError(Exception):
    """A location that cannot be reached or read: one line naming it."""


def is_uri(location: str) -> bool:
    """An object-store URI (``s3://...``), not a local path."""
    return location.startswith(URI_SCHEMES)


def join(location: str, *names: str) -> str:
    """``location`` / ``names``: a URI joined with ``/``, a local path with the OS's rules."""
    if is_uri(location):
        return posixpath.join(location.rstrip("/"), *names)
    return os.path.join(location, *names)


def arrow_fs() -> Any:
    """``pyarrow.fs``, imported at its first use: a role that never names a location through
    it (a shard checkpointing to a local directory) never loads pyarrow (about 35 MB)."""
    import pyarrow.fs

    return pyarrow.fs


def is_file(info: pafs.FileInfo) -> bool:
    return bool(info.type == arrow_fs().FileType.File)


def is_directory(info: pafs.FileInfo) -> bool:
    return bool(info.type == arrow_fs().FileType.Directory)


@functools.lru_cache(maxsize=16)
def _filesystem_for(scheme_and_bucket: str, _endpoint: str | None) -> pafs.FileSystem:
    fs, _ = arrow_fs().FileSystem.from_uri(scheme_and_bucket)
    return fs


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path within it) of a location. One filesystem per bucket and process
    (pyarrow's S3 client is thread-safe; not fork-safe: a forked child must not use its
    parent's, which is why checkpoints are staged on the local disk and uploaded by the
    parent)."""
    if not is_uri(location):
        return arrow_fs().LocalFileSystem(), location
    scheme, _, rest = location.partition("://")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise StorageError(f"{location}: no bucket in the URI")
    try:
        fs = _filesystem_for(f"{scheme}://{bucket}", os.environ.get("AWS_ENDPOINT_URL"))
    except (OSError, ValueError) as exc:
        raise StorageError(f"{location}: {exc}") from None
    return fs, posixpath.join(bucket, key) if key else bucket


def describe(exc: BaseException) -> str:
    """pyarrow's error text, first line only."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def open_input(location: str) -> Any:
    """A seekable binary file over a local file or an object (ranged GETs on S3);
    FileNotFoundError when there is none."""
    fs, path = filesystem(location)
    try:
        return fs.open_input_file(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if file_info(location).type == arrow_fs().FileType.NotFound:
            raise FileNotFoundError(location) from None
        raise StorageError(f"{location}: {describe(exc)}") from None


# -- reading data: what a directory or prefix holds, and a Python file over an object ----------

READ_BUFFER = 8 << 20   # an object read through open_reader: one ranged GET per 8 MiB at least


def file_info(location: str) -> pafs.FileInfo:
    """pyarrow's FileInfo of a location (``type`` NotFound when there is none; ``size`` and
    ``mtime_ns`` of a file or object)."""
    fs, path = filesystem(location)
    try:
        return fs.get_file_info(path)
    except OSError as exc:
        raise StorageError(f"{location}: {describe(exc)}") from None


def listing(location: str, recursive: bool = False,
            missing_ok: bool = False) -> list[tuple[str, pafs.FileInfo]]:
    """What a directory (a prefix in a bucket) holds (directly, or ``recursive``ly): each
    entry's location (a URI under a URI) and its FileInfo, sorted by name; with
    ``missing_ok``, nothing for a directory that is not there."""
    fs, path = filesystem(location)
    try:
        infos = fs.get_file_info(arrow_fs().FileSelector(path, recursive=recursive,
                                                         allow_not_found=missing_ok))
    except OSError as exc:
        raise StorageError(f"{location}: {describe(exc)}") from None
    return sorted(((join(location, posixpath.relpath(i.path, path)), i) for i in infos),
                  key=lambda e: e[0])


def open_reader(location: str, buffer_size: int = READ_BUFFER) -> Any:
    """A Python binary file (read, readline, seek, tell) over a local file (``open``) or an
    object: buffered by ``buffer_size``, and a read larger than that is one ranged GET, so a
    stream of large reads costs a request per read and small ones (gzip's) one per buffer."""
    if not is_uri(location):
        return open(location, "rb")
    import io
    return io.BufferedReader(open_input(location), buffer_size=buffer_size)
