"""A feeder's reading of a stream (``EventReader``): a thread that fetches messages from the
broker and decodes them (``EventDecoder``) into a bounded queue, so that the feeder's loop never
waits on the broker; the loop takes what is read (``take``) when it has room for it.

At most ``max_messages`` messages wait decoded and not taken (the loop's batches in flight are
bounded by its ledger): memory does not grow with the stream. A broker that stops answering
(``BrokerError``, or a client's own exception, from a fetch) is retried every ``retry_s`` (the
clients reconnect by
themselves); ``broker_down_since`` says since when, for the status and the console, and the
lag grows meanwhile. The consumer itself is the loop's for acknowledging (``done``,
``working``) through this thread: every call on the consumer is made here (a Kafka consumer
called from two threads blocked).
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from roles.events import Consumer, Delivery
from roles.events.decode import Decoded, EventDecoder

log = logging.getLogger(__name__)
FETCH_WAIT_S = 0.05  # a fetch waits this long for a first message (acks wait as long)
LAG_EVERY_S = 1.0    # the broker is asked for the group's lag this often
WORKING_S = 5.0      # messages read and not taken this long are said in progress (or less:
                     # ``working_s``, a third of a shorter ack wait)


def coalesced(calls: list[tuple[str, list[Delivery], int]]
              ) -> list[tuple[str, list[Delivery], int]]:
    """The loop's calls in order, each run of acknowledgements one (its number, the calls
    it makes one, where a forget has its revoke's): a JetStream ``done``
    flushes the connection, a round trip to the server, and one for every batch trained kept
    the client's event-loop thread busy (Adult x 10, 488,420 events, Intel Xeon: that thread
    1.11-1.19 s of CPU with a call a batch, 0.60-0.79 s with one a run)."""
    out: list[tuple[str, list[Delivery], int]] = []
    for what, deliveries, revoke in calls:
        if what == "done" and out and out[-1][0] == "done":   # (a done's number: the calls)
            out[-1] = ("done", out[-1][1] + deliveries, out[-1][2] + 1)
        else:
            out.append((what, list(deliveries), 1 if what == "done" else revoke))
    return out


class EventReader:
    def __init__(self, consumer: Consumer, decoder: EventDecoder, max_messages: int = 10_000,
                 fetch_messages: int = 500, retry_s: float = 1.0,
                 working_s: float = WORKING_S):
        self.consumer, self.decoder = consumer, decoder
        self.working_s = working_s
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
        self.lag_messages: int | None = None   # the broker's, asked every LAG_EVERY_S
        self.acks_failed = 0   # acknowledgements that failed: their messages come again
        self._lag_at = 0.0
        # the loop's calls on the consumer, made here: a Kafka consumer called from two
        # threads at once blocked (a commit behind a committed(), measured)
        self._calls: queue.Queue[tuple[str, list[Delivery], int]] = queue.Queue()
        self._fetching = True
        self._queued: list[tuple[float, list[Delivery]]] = []   # read, not taken: since when
        self._final: queue.Queue[int | None] = queue.Queue()
        consumer.serve = self._serve_waiting
        self._thread = threading.Thread(target=self._run, name="event-reader", daemon=True)
        self._thread.start()

    def _room(self) -> int:
        with self._changed:
            self._changed.wait_for(lambda: self._held < self.max_messages or
                                   self._stop.is_set(), timeout=FETCH_WAIT_S)
            return min(self.fetch_messages, self.max_messages - self._held)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._serve()
            if not self._fetching:
                self._stop.wait(FETCH_WAIT_S)
                continue
            room = self._room()
            if room <= 0 or self._stop.is_set():
                continue
            try:
                got = self.consumer.fetch(room, FETCH_WAIT_S)
            except Exception as exc:   # BrokerError, or a client's own on a reconnect
                self.last_error = str(exc)   # first: whoever sees it down reads why
                if self.broker_down_since is None:
                    self.broker_down_since = time.time()
                    log.warning("the stream's broker: %s (trying again)", exc)
                self._stop.wait(self.retry_s)
                continue
            if self.broker_down_since is not None:
                log.info("the stream's broker answers again after %.0f s",
                         time.time() - self.broker_down_since)
                self.broker_down_since = None
            self._ask_lag()
            if got:
                decoded = self.decoder.decode(got)
                with self._changed:
                    self._held += len(got)
                    self._queued.append((time.monotonic(), got))
                self.messages_read += len(got)
                self.events_read += decoded.events
                self._queue.put((got, decoded))

    def _serve(self) -> None:
        """The loop's acknowledgements, in-progress acks and its last question; messages read
        and not yet taken that have waited ``working_s`` are said in progress."""
        self._keep_queued()
        calls = []
        while True:
            try:
                calls.append(self._calls.get_nowait())
            except queue.Empty:
                break
        for what, deliveries, number in coalesced(calls):   # (a forget's revoke, a done's
            # number of acknowledgements: ``coalesced``)
            try:
                if what == "done":
                    self.consumer.done(deliveries)
                elif what == "working":
                    self.consumer.working(deliveries)
                elif what == "forget":
                    self.consumer.forget(deliveries, number)
                else:   # "final": every ack settled, then the lag
                    self.consumer.settle()
                    self._final.put(sum(self.consumer.lag().values()))
            except Exception as exc:   # not acknowledged: the broker delivers it again
                log.warning("the stream's broker: %s", exc)
                if what == "done":   # (each acknowledgement asked that failed)
                    self.acks_failed += number
                if what == "final":
                    self._final.put(None)

    def _serve_waiting(self) -> bool:
        """The consumer waits inside a fetch for messages to be done (a Kafka revoke): the
        loop's acknowledgements are served meanwhile; False (stop waiting) once the reader
        stops (after the stream's end the batches already made are still trained)."""
        if self._stop.is_set():
            return False
        self._serve()
        return True

    def _keep_queued(self) -> None:
        now = time.monotonic()
        with self._changed:
            due = [d for at, d in self._queued if now - at >= self.working_s]
            self._queued = [(now if now - at >= self.working_s else at, d)
                            for at, d in self._queued]
        if due:
            try:
                self.consumer.working([x for d in due for x in d])
            except Exception as exc:
                log.warning("the stream's broker: %s", exc)

    def stopped(self) -> bool:
        """Closed, and the thread has ended (the consumer may be closed)."""
        return self._stop.is_set() and not self._thread.is_alive()

    def alive(self) -> bool:
        """The thread runs (it ends only when closed)."""
        return self._thread.is_alive() or self._stop.is_set()

    @property
    def acks_refused(self) -> int:
        """Acknowledgements the broker did not take (their messages come again, and what was
        trained of them is trained again by whoever reads them next): those that failed, and
        Kafka's commits the group refused mid-rebalance."""
        return self.acks_failed + self.consumer.commits_refused

    def done(self, deliveries: list[Delivery]) -> None:
        """Acknowledge these messages to the broker (on this thread, within a fetch's wait)."""
        self._calls.put(("done", deliveries, 0))

    def working(self, deliveries: list[Delivery]) -> None:
        self._calls.put(("working", deliveries, 0))

    def revoking(self) -> tuple[int, frozenset[int]]:
        """(Revokes so far, the partitions of the one under way: set aside what is read of
        them and not begun, and ``forget`` it; the revoke waits for the rest.)"""
        return self.consumer.revoking

    def forget(self, deliveries: list[Delivery], revoke: int) -> None:
        """The loop's answer to the revoke numbered ``revoke``: these messages were set aside
        untrained (their partition revoked)."""
        self._calls.put(("forget", deliveries, revoke))

    def stop_fetching(self) -> None:
        """No more messages are read (those read and not taken are left unacknowledged);
        acknowledgements go on."""
        self._fetching = False

    def final_lag(self, timeout_s: float = 30.0) -> int | None:
        """Once every acknowledgement asked for is settled with the broker: its lag (None: it
        did not say)."""
        self._calls.put(("final", [], 0))
        try:
            return self._final.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def _ask_lag(self) -> None:
        now = time.monotonic()
        if now - self._lag_at < LAG_EVERY_S:
            return
        self._lag_at = now
        try:
            self.lag_messages = sum(self.consumer.lag().values())
        except Exception:   # a broker away: said at the next fetch
            pass

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
                self._queued = self._queued[len(out):]   # taken in the order queued
                self._changed.notify_all()
        return out

    def close(self) -> None:
        """Stops reading (what was read and not taken is left unacknowledged: the broker
        delivers it again)."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join(timeout=10)
        if self._thread.is_alive():   # inside a broker call: the consumer is still its own
            log.warning("the stream's reader did not stop within 10 s")
            return
        self._serve()   # acknowledgements asked for before the stop

    def shut(self, what: str) -> None:
        """``close``, then the consumer's own close once the thread has ended (else the thread
        is still inside a broker call, and the consumer is still its own); ``what`` names it
        in the line said when a broker already gone cannot be told."""
        self.close()
        if self.stopped():
            try:
                self.consumer.close()
            except Exception as exc:   # a broker gone: nothing more to say to it
                log.info("closing %s consumer: %s", what, exc)
