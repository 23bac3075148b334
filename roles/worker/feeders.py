"""A worker's side of the feeders: the sample queue it pulls from and the feeders' ledgers it
takes batches from and acknowledges them to.

One PULL socket fair-queues the sample queues of every feeder (``samples``); it is paused while
the pipeline is full, before the first weights, before control's PartMap and while leaving
(``gate``). A batch pulled is asked for (Taken, or several in one Taking) only while fewer than
the take window (``roles.algorithms.worker.window``) are asked ahead of the one training, in pull
order; the rest stay untaken, so that at the end of a pass the feeder can hand copies of them to
an idle worker. The ack of a batch goes at the start of the loop's next turn (``flush_acks``),
with the takes that follow it to the same feeder (AckTaking). A restarted feeder is told what its
dead process may have lost, after connecting anew to it if it was made again elsewhere (a pod
rescheduled: ``relink``), a moved part's batches are asked of its new feeder
(``roles.algorithms.worker.feeder_links``), and the queue is widened for a long link
(``widen``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np
import zmq

from roles.algorithms.worker.feeder_links import FeederLinks
from roles.algorithms.worker.pulled import Pipeline
from roles.algorithms.worker.window import TakeWindow
from roles.job.cli import MAX_WORKERS
from roles.job.settings import Job
from roles.protocol.datapath import (
    Ack,
    AckTaking,
    Holding,
    Idle,
    PartMap,
    SampleBatch,
    Taken,
    Taking,
    max_in_flight,
)
from zbus.codec import Message

log = logging.getLogger(__name__)

Send = Callable[[zmq.Socket, Message], object]


class FeederSide:
    def __init__(self, job: Job, name: str, pipeline: Pipeline, samples: zmq.Socket,
                 feeders: list[zmq.Socket], send: Send,
                 pause: Callable[[zmq.Socket, bool], None],
                 moved: Callable[[zmq.Socket], bool] = lambda sock: False,
                 renew: Callable[[zmq.Socket], zmq.Socket] = lambda sock: sock):
        c, t = job.cluster, job.train
        self.name, self.prefetch = name, t.prefetch
        self.pipeline, self.samples, self.feeders = pipeline, samples, feeders
        self.send, self.pause = send, pause
        self.moved, self.renew = moved, renew   # the loop's (zbus.node.Loop)
        self.push = t.embeddings == "push"
        # connected to every feeder's queue, as many times as ``widen`` says
        self.sample_queues = [c.endpoint(c.feeder_endpoint_name("samples", f))
                              for f in range(c.feeders)]
        self.sample_links = 1
        self.links = FeederLinks(c.feeders, max_in_flight(MAX_WORKERS, t.prefetch))
        self.grants_ahead = min(t.grants_ahead, t.prefetch + 1)  # no more than it can pull
        self.window = TakeWindow(t.prefetch + 1)  # from grants_ahead up, sized for the link
        self.run_started = 0.0  # when the batch running began (its time: TakeWindow)
        self.acks_due: deque[Ack] = deque()  # sent at the next turn's start (flush_acks)
        self.idle_since: float | None = None  # said Idle, and nothing has come since
        self.idle_said = False
        self.counts = {"refused_batches": 0, "copies_ignored": 0}

    def gate(self, leaving: bool) -> None:
        """Pull while the pipeline has room for another batch, and not while leaving (nor
        before the PartMap says which feeder each batch belongs to)."""
        self.pause(self.samples, leaving or self.links.owners is None
                   or len(self.pipeline) > self.prefetch)

    def pulled(self, s: SampleBatch) -> bool:
        """A batch from the sample queue: False when it is a second copy of one here."""
        if self.pipeline.pulled(s) is None:  # a second copy of a straggler: have it
            self.counts["copies_ignored"] += 1
            return False
        self.idle_said = False
        self.idle_since = None
        self.ask_next()
        return True

    def answered(self, batch_id: int, granted: bool) -> bool:
        """The feeder's answer to a take; False when the batch is not here."""
        batch = self.pipeline.batches.get(batch_id)
        if batch is None or not self.pipeline.granted(batch_id, granted):
            return False
        if batch.asked_at is not None:  # the first answer to its take: a round trip
            self.window.answered(time.monotonic() - batch.asked_at)
            batch.asked_at = None
            self.widen()
        if not granted:  # another worker holds this batch (a copy sent again)
            self.counts["refused_batches"] += 1
            self.ask_next()
        return True

    def widen(self) -> None:
        """Open more connections to each feeder's sample queue while the measured round trip
        and batch time say one carries too few batches (``TakeWindow.links``, at most
        ``prefetch`` + 1). Over TCP only: the kernel's buffers of an ipc:// connection are not
        sized, nor is its round trip long."""
        want = self.window.links(self.prefetch + 1)
        if want <= self.sample_links or not self.sample_queues[0].startswith("tcp://"):
            return
        for _ in range(want - self.sample_links):
            for endpoint in self.sample_queues:
                self.samples.connect(endpoint)
        log.info("%s: %d connections to each sample queue (round trip %.2f ms, batch %.2f ms)",
                 self.name, want, 1000 * (self.window.rtt() or 0.0),
                 1000 * (self.window.batch_s or 0.0))
        self.sample_links = want

    def running(self, batch_id: int) -> None:
        """A batch starts: it is held until its ack is sent, and its place among those asked
        ahead goes to the next (whose grant comes back while this one trains)."""
        self.links.running(batch_id)
        self.run_started = time.monotonic()
        self.ask_next()

    def ask_next(self, ack: Ack | None = None) -> None:
        """Keep the window's batches asked for ahead of the one training, in pull order
        (``Pipeline.to_ask``; ``TakeWindow``), the takes of each feeder in one message. With
        an ``ack`` (sent here, first), the batch that runs next is counted out of the window
        already, so that the take which replaces it goes with the ack (AckTaking) rather than
        alone when that batch starts."""
        now = time.monotonic()
        feeder = None if ack is None else self.links.acked(ack)
        if ack is not None:
            self.window.ran(now - self.run_started)
        ahead = self.window.ahead(self.grants_ahead)
        if ack is not None and self.pipeline.next_granted():
            ahead += 1
        takes: dict[int, list[int]] = {}
        while (batch := self.pipeline.to_ask(self.links.unacked, ahead)) is not None:
            takes.setdefault(self.links.feeder_of(batch.batch_id), []).append(batch.batch_id)
            batch.asked_at = now
            if self.push:  # its grant sends the shards' rows here
                batch.looked_up_at = now
        if ack is not None and feeder is not None:
            mine = takes.pop(feeder, [])
            self.send(self.feeders[feeder], AckTaking.of(ack, mine) if mine else ack)
        for f, ids in takes.items():
            self.send(self.feeders[f], Taken(batch_id=ids[0]) if len(ids) == 1
                      else Taking(takes=np.array(ids, dtype=np.int64)))

    def flush_acks(self) -> None:
        """The acks due, each with the takes that follow it to the same feeder (AckTaking): a
        copy of the batch, pulled while it ran, may be asked for now, and the batch that runs
        next leaves its place among those asked ahead to another."""
        while self.acks_due:
            self.ask_next(self.acks_due.popleft())

    def say_idle(self) -> None:
        """Nothing here to run: the feeders may send copies of stragglers (once, until the
        next batch arrives)."""
        self.idle_said = True
        for sock in self.feeders:
            self.send(sock, Idle())
        self.idle_since = time.monotonic()

    def starved(self, now: float, after_s: float) -> bool:
        """Idle for ``after_s`` (the end of a pass)."""
        return self.idle_since is not None and now - self.idle_since >= after_s

    def restarted(self, feeder: int, generation: int) -> bool:
        """FeederBack: tell a restarted feeder what its dead process may have lost
        (``FeederLinks.restarted``); True when its links were connected anew (``relink``: the
        caller gates the sample queue again)."""
        if not self.links.restart(feeder, generation):
            return False
        relinked = self.moved(self.feeders[feeder])
        if relinked:
            self.relink(feeder)
        messages = self.links.restarted(feeder, self.pipeline)
        for msg in messages:
            self.send(self.feeders[feeder], msg)
        held = next(m for m in messages if isinstance(m, Holding))
        log.warning("feeder-%d restarted: sent it %d acks again and %d batches held",
                    feeder, len(self.links.acks_kept[feeder]), len(held.held))
        return relinked

    def relink(self, feeder: int) -> None:
        """The feeder was made again elsewhere (its host gone without closing the connections,
        which then look open for minutes): its ledger link and the sample queues connected
        anew. What was queued from the dead process is dropped: the new one sends again
        whatever nobody holds."""
        self.feeders[feeder] = self.renew(self.feeders[feeder])
        self.samples = self.renew(self.samples)   # connected to the first queue again
        for link in range(self.sample_links):
            for endpoint in self.sample_queues[1 if link == 0 else 0:]:
                self.samples.connect(endpoint)

    def part_map(self, m: PartMap) -> bool:
        """Control's PartMap: False when it is not newer; the batches of a moved part are
        asked of its new feeder."""
        if not self.links.newer(m):
            return False
        for feeder, taken in self.links.moved(m, self.pipeline):
            self.send(self.feeders[feeder], taken)
        return True

    def counters(self) -> dict:
        return {**self.counts, "sample_links": self.sample_links,
                **self.window.counters(self.grants_ahead)}
