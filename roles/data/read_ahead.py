"""Making ahead: an iterator's next items are made on a reader thread while the caller uses the
ones before (pyarrow's parser, file reads and most of numpy's arithmetic release the GIL, so
the two overlap on two cores). A feeder makes its parts' batches so (``roles.feeder.streams``:
read, parsed, prepared, shuffled and cut, ``batches_ahead`` per part), the streaming
reference its blocks.

One reader thread serves every iterator of a process, in the order their items were asked for:
each iterator has at most ``depth`` items made ahead, so the memory it adds is that many items
per open part (``[data] parts_open``). The items of an iterator come in their order, whatever
thread made them: batch ids stay reproducible. An error met while making one (a
``DataError``, an ``OSError``) is raised where that item is taken, as it would be without the
thread, and the iterator ends after it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
_END = object()
DEPTH = 2   # items made ahead of the one taken, per iterator


class ReadAhead(Generic[T]):
    """An iterator whose next ``depth`` items are always being made on the reader (its one
    thread runs them in order, so the underlying iterator is never entered twice at once)."""

    def __init__(self, items: Iterator[T], reader: ThreadPoolExecutor, depth: int = DEPTH):
        self.items, self.reader = items, reader
        self.ended = False   # the underlying iterator has said so (or raised)
        self.pending: deque[Future[object]] = deque(reader.submit(self._take)
                                                    for _ in range(max(1, depth)))

    def _take(self) -> object:
        if self.ended:
            return _END
        try:
            item = next(self.items, _END)
        except BaseException:
            self.ended = True
            raise
        if item is _END:
            self.ended = True
        return item

    def __iter__(self) -> ReadAhead[T]:
        return self

    def __next__(self) -> T:
        if not self.pending:
            raise StopIteration
        item = self.pending.popleft().result()  # the reader's exception, if it met one
        if item is _END:
            self.pending.clear()   # those behind it can only be ends too
            raise StopIteration
        self.pending.append(self.reader.submit(self._take))
        return item  # type: ignore[return-value]


class Reader:
    """The reader thread of a process, and the read-ahead iterators made on it."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zbus-reader")

    def ahead(self, items: Iterator[T], depth: int = DEPTH) -> Iterator[T]:
        return ReadAhead(items, self.pool, depth)

    def submit(self, job: Callable[..., object], *args: object) -> None:
        """Run ``job(*args)`` on the reader thread after what is queued there (its error, if
        any, is logged)."""
        self.pool.submit(job, *args).add_done_callback(_log_error)

    def close(self) -> None:
        """Blocks being read are finished, none queued is started."""
        self.pool.shutdown(wait=True, cancel_futures=True)


def _log_error(done: Future[object]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.warning("reading ahead failed (the pass reads it again): %s", done.exception())
