"""A directory of files written whole, on the local disk or in an object store
(``roles.storage.fs``): where checkpoints and exports go.

Writers write a file under its local path (``local(name)``; on the local disk that is its
final place, written atomically as before) and then ``publish`` it: in an object store the
file is uploaded from the local staging directory (an object appears whole once its upload
completes) and its local copy removed. A store has no atomic rename, so what makes a set of
files complete is a marker written last (a checkpoint's manifest, then ``LATEST``).

Processes that fork (a shard's checkpoint writer) must not use the store in the child:
pyarrow's S3 client is not fork-safe, so the child writes the local file and the parent
publishes it.
"""

from __future__ import annotations

import posixpath
import shutil
from pathlib import Path
from typing import Any

from roles.storage.fs import (
    StorageError,
    describe,
    file_info,
    filesystem,
    is_directory,
    is_file,
    is_uri,
    join,
    listing,
    open_input,
)
from zbus.files import atomic_write, temp_glob


def parent(location: str) -> str:
    """The directory a location is in."""
    if is_uri(location):
        return posixpath.dirname(location.rstrip("/"))
    return str(Path(location).parent)


def basename(location: str) -> str:
    return posixpath.basename(location.rstrip("/")) if is_uri(location) else Path(location).name


class Store:
    def __init__(self, root: str, staging: Path | None = None):
        """``root``: a local directory or an ``s3://`` prefix; ``staging``: where this
        process writes files before publishing them to a remote root (unused for a local
        one, whose files are written in place)."""
        self.root = root.rstrip("/") if is_uri(root) else root
        self.remote = is_uri(root)
        self.staging = staging if self.remote and staging is not None else Path(root)

    def __repr__(self) -> str:
        return f"Store({self.root!r})"

    def location(self, name: str = "") -> str:
        return join(self.root, name) if name else self.root

    def local(self, name: str) -> Path:
        """Where this process writes ``name`` (its final place on a local root)."""
        return self.staging / name

    # -- writing ------------------------------------------------------------------------------
    def publish(self, names: list[str]) -> None:
        """Make the files written under ``local(name)`` part of the store (a remote root:
        uploaded, then their local copies removed; a local root: already there)."""
        if not self.remote:
            return
        fs, base = filesystem(self.root)
        for name in names:
            source = self.local(name)
            try:
                with open(source, "rb") as src, \
                        fs.open_output_stream(posixpath.join(base, name)) as dst:
                    shutil.copyfileobj(src, dst, 8 << 20)
            except OSError as exc:
                raise StorageError(f"cannot upload {name} to {self.root}: "
                                   f"{describe(exc)}") from None
            source.unlink(missing_ok=True)

    def discard_staged(self, patterns: list[str]) -> list[str]:
        """Remove what a killed process of this writer left behind, before it writes again:
        the temporary files of its unfinished writes and, for a remote root, the staged files
        it never uploaded (or uploaded, and was killed before removing). ``patterns``: the
        writer's own file names as globs relative to the root (``*/ps-1.npz``), so that
        writers sharing a staging directory keep each other's files. The names removed."""
        gone: list[str] = []
        if not self.staging.is_dir():
            return gone
        for pattern in patterns:
            head, _, tail = pattern.rpartition("/")
            temps = f"{head}/{temp_glob(tail)}" if head else temp_glob(tail)
            for found in [*(self.staging.glob(pattern) if self.remote else ()),
                          *self.staging.glob(temps)]:
                if found.is_file():
                    found.unlink(missing_ok=True)
                    gone.append(found.relative_to(self.staging).as_posix())
        return gone

    def put_bytes(self, name: str, data: bytes) -> None:
        """Write a small file whole: atomically and durably on the local disk, as one object
        in a store."""
        if not self.remote:
            path = Path(self.root) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data, durable=True)
            return
        fs, base = filesystem(self.root)
        try:
            with fs.open_output_stream(posixpath.join(base, name)) as dst:
                dst.write(data)
        except OSError as exc:
            raise StorageError(f"cannot write {name} to {self.root}: {describe(exc)}") from None

    def remove(self, name: str) -> None:
        """Remove a file or a directory of files (nothing when there is none)."""
        if not self.remote:
            path = Path(self.root) / name
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            return
        fs, base = filesystem(self.root)
        target = posixpath.join(base, name)
        try:
            info = fs.get_file_info(target)
            if is_directory(info):
                fs.delete_dir(target)
            elif is_file(info):
                fs.delete_file(target)
        except OSError as exc:
            raise StorageError(f"cannot remove {name} from {self.root}: "
                               f"{describe(exc)}") from None

    # -- reading ------------------------------------------------------------------------------
    def size(self, name: str) -> int | None:
        """The size of file ``name``; None when there is none."""
        if not self.remote:
            try:
                return (Path(self.root) / name).stat().st_size
            except OSError:
                return None
        info = file_info(self.location(name))
        return info.size if is_file(info) else None

    def read_bytes(self, name: str) -> bytes:
        """The whole file (FileNotFoundError when there is none)."""
        if not self.remote:
            return (Path(self.root) / name).read_bytes()
        with self.open(name) as f:
            return bytes(f.read())

    def open(self, name: str) -> Any:
        """A seekable binary file (on S3, ranged reads of the object)."""
        if not self.remote:
            return open(Path(self.root) / name, "rb")
        return open_input(self.location(name))

    def entries(self) -> list[str]:
        """The names directly under the root (files and directories)."""
        if not self.remote:
            root = Path(self.root)
            return sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        return [info.base_name for _, info in listing(self.root, missing_ok=True)]

    def files(self) -> list[str]:
        """Every file under the root, as names relative to it."""
        if not self.remote:
            root = Path(self.root)
            return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        return [posixpath.relpath(where, self.root)
                for where, info in listing(self.root, recursive=True, missing_ok=True)
                if is_file(info)]

    def download(self, names: list[str], into: Path) -> None:
        """Copy files of the store to the local directory ``into`` (the same names)."""
        for name in names:
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with self.open(name) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 8 << 20)

    def is_dir(self, name: str = "") -> bool:
        if not self.remote:
            return (Path(self.root) / name).is_dir()
        return is_directory(file_info(self.location(name)))

