"""Connecting to a broker off the caller's loop (``Opening``): a feeder's loop must go on
turning while its consumer opens (heartbeats, control's messages): a connection's timeout is
seconds, and a JetStream feeder that is not feeder 0 waits, after a roll back, until feeder 0
has made the group's consumer anew (up to ``nats_js.REWIND_WAIT_S``). In one process with the
other roles (the test cluster, which turns every role on one thread) such a wait inside the
loop could never end: feeder 0 does not turn while it lasts.

``connect`` runs on a thread of its own; the loop asks ``result`` each turn. What it raises is
the opening's failure, in one line. Abandoned (the process stops while it connects), what it
made is closed once made.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Opening(Generic[T]):
    """``connect`` run on a thread; ``close`` closes what it returned, were it abandoned."""

    def __init__(self, connect: Callable[[], T], close: Callable[[T], None], name: str):
        self._close = close
        self._lock = threading.Lock()
        self._value: T | None = None
        self._failed: str | None = None
        self._done = False
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, args=(connect,), name=name,
                                        daemon=True)
        self._thread.start()

    def _run(self, connect: Callable[[], T]) -> None:
        value: T | None = None
        failed: str | None = None
        try:
            value = connect()
        except Exception as exc:   # (the caller's one line: BrokerError's own words)
            failed = str(exc) or type(exc).__name__
        with self._lock:
            self._value, self._failed, self._done = value, failed, True
            abandoned = self._abandoned
        if abandoned and value is not None:
            self._close(value)

    def result(self) -> tuple[bool, T | None, str | None]:
        """(whether it is done, what ``connect`` returned, why it failed)."""
        with self._lock:
            return self._done, self._value, self._failed

    def abandon(self) -> None:
        """No one will take the result: closed when made (now, if it is)."""
        with self._lock:
            self._abandoned = True
            value = self._value if self._done else None
            self._value = None
        if value is not None:
            self._close(value)
