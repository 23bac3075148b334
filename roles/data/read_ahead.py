"""Reading one block ahead: a part's next block is read and parsed on a reader thread while
the feeder hashes, transforms and batches the one before (pyarrow's parser and file reads
release the GIL, so the two overlap on two cores).

One reader thread serves every open part of a process: each part has at most one block read
ahead, so the memory it adds is one parsed block per open part (``[data] parts_open``). The
blocks of a part come in their order, whatever thread read them: batch ids stay reproducible.
An error met while reading (a ``DataError``, an ``OSError``) is raised where the block is
taken, as it would be without the thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")
_END = object()


class ReadAhead(Generic[T]):
    """An iterator whose next item is always being made on the reader."""

    def __init__(self, items: Iterator[T], reader: ThreadPoolExecutor):
        self.items, self.reader = items, reader
        self.pending: Future[object] | None = reader.submit(self._take)

    def _take(self) -> object:
        return next(self.items, _END)

    def __iter__(self) -> ReadAhead[T]:
        return self

    def __next__(self) -> T:
        if self.pending is None:
            raise StopIteration
        item = self.pending.result()  # the reader's exception, if it met one
        if item is _END:
            self.pending = None
            raise StopIteration
        self.pending = self.reader.submit(self._take)
        return item  # type: ignore[return-value]


class Reader:
    """The reader thread of a process, and the read-ahead iterators made on it."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zbus-reader")

    def ahead(self, items: Iterator[T]) -> Iterator[T]:
        return ReadAhead(items, self.pool)

    def close(self) -> None:
        """Blocks being read are finished, none queued is started."""
        self.pool.shutdown(wait=True, cancel_futures=True)
