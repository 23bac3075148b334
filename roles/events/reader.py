"""A feeder's reading of a stream (``EventReader``): a thread that fetches messages from the
broker and decodes them (``EventDecoder``) into a bounded queue, so that the feeder's loop never
waits on the broker; the loop takes what is read (``take``) when it has room for it.

At most ``max_messages`` messages wait decoded and not taken (the loop's batches in flight are
bounded by its ledger): memory does not grow with the stream. A broker that stops answering
(``BrokerError`` from a fetch) is retried every ``retry_s`` (the clients reconnect by
themselves); ``broker_down_since`` says since when, for the status and the console, and the
lag grows meanwhile. The consumer itself is the loop's for acknowledging (``done``,
``working``): the clients are safe to call from two threads.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from roles.events import BrokerError, Consumer, Delivery
from roles.events.decode import Decoded, EventDecoder

log = logging.getLogger(__name__)
FETCH_WAIT_S = 0.2   # a fetch waits this long for a first message (and the thread's stop)


class EventReader:
    def __init__(self, consumer: Consumer, decoder: EventDecoder, max_messages: int = 10_000,
                 fetch_messages: int = 500, retry_s: float = 1.0):
        self.consumer, self.decoder = consumer, decoder
        self.max_messages, self.fetch_messages, self.retry_s = \
            max_messages, fetch_messages, retry_s
        self._queue: queue.Queue[tuple[list[Delivery], Decoded]] = queue.Queue()
        self._changed = threading.Condition()
        self._held = 0   # messages read and not taken
        self._stop = threading.Event()
        self.broker_down_since: float | None = None
        self.last_error = ""
        self.messages_read = 0
        self.events_read = 0
        self._thread = threading.Thread(target=self._run, name="event-reader", daemon=True)
        self._thread.start()

    def _room(self) -> int:
        with self._changed:
            self._changed.wait_for(lambda: self._held < self.max_messages or
                                   self._stop.is_set(), timeout=FETCH_WAIT_S)
            return min(self.fetch_messages, self.max_messages - self._held)

    def _run(self) -> None:
        while not self._stop.is_set():
            room = self._room()
            if room <= 0 or self._stop.is_set():
                continue
            try:
                got = self.consumer.fetch(room, FETCH_WAIT_S)
            except BrokerError as exc:
                if self.broker_down_since is None:
                    self.broker_down_since = time.time()
                    log.warning("the stream's broker: %s (trying again)", exc)
                self.last_error = str(exc)
                self._stop.wait(self.retry_s)
                continue
            if self.broker_down_since is not None:
                log.info("the stream's broker answers again after %.0f s",
                         time.time() - self.broker_down_since)
                self.broker_down_since = None
            if got:
                decoded = self.decoder.decode(got)
                with self._changed:
                    self._held += len(got)
                self.messages_read += len(got)
                self.events_read += decoded.events
                self._queue.put((got, decoded))

    def take(self) -> list[tuple[list[Delivery], Decoded]]:
        """What has been read since the last take (never waits); its room is free again."""
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if out:
            with self._changed:
                self._held -= sum(len(d) for d, _ in out)
                self._changed.notify_all()
        return out

    def close(self) -> None:
        """Stops reading (what was read and not taken is left unacknowledged: the broker
        delivers it again)."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join(timeout=10)
