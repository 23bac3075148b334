"""Kafka as a stream job's source (``confluent-kafka``, librdkafka).

The job's feeders are one consumer group: Kafka spreads the topic's partitions over them and
moves a partition to another feeder when its feeder leaves or dies (a rebalance). Offsets are
committed by hand (``enable.auto.commit`` off), synchronously, and only past the done prefix of
each partition (``watermark``): a commit says "everything before this offset is trained", so a
message trained ahead of an earlier one waits for it. When a partition is taken away, what is
done of it is committed, once what was delivered of it is done or set aside: a revoke says
which partitions go (``revoking``), the feeder sets aside untrained what it has read of them
and not begun to train and says so (``forget``), and the revoke waits (up to ``settle_s``, the
stream's ``ack_wait_s``) while the feeder trains what it has begun, serving the feeder's
acknowledgements meanwhile (``serve``, its reader's), so that the next owner reads on from an
offset past everything trained here and before everything set aside: a rebalance trains
nothing twice. What is still not done when that wait times out goes, with the partition, to
its next owner, from the committed offset, and is trained twice (counted with the refused
commits). A partition that comes back to this feeder after a commit the group refused reads
on from this feeder's own floor (``_read_on``). Leaving the group (``close``) waits for
nothing: what is not done is not committed.

A job gone back to a checkpoint reads each partition again from the checkpoint's first offset
not done (``rewind``), once: the feeder a partition is first assigned to in that roll back
seeks it there and commits that offset at once, with the roll back's name as the commit's
metadata (``rewind_id``; every later commit of the run carries it too). A feeder the partition
goes to later (a rebalance: a second feeder joining, one leaving) finds its commit so named and
reads on from it, rather than from the checkpoint again, which would train twice what the
first owner trained since.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from roles.events import BrokerError, Delivery
from roles.events.watermark import Watermark

log = logging.getLogger(__name__)

OWN_SETTINGS = ("bootstrap.servers", "group.id", "enable.auto.commit", "auto.offset.reset")


class KafkaConsumer:
    shared = False   # (each partition has one owner at a time)

    def __init__(self, servers: str, topic: str, group: str, start: str,
                 options: dict[str, object], timeout_s: float = 10.0,
                 rewind: dict[int, int] | None = None, rewind_id: str = "",
                 settle_s: float = 30.0):
        from confluent_kafka import Consumer, KafkaException
        ours = sorted(set(options) & set(OWN_SETTINGS))
        if ours:
            raise BrokerError(f"[stream.options] {', '.join(ours)}: set by the job "
                              "([stream] url, group, start)")
        config = {"bootstrap.servers": servers, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": start, **{k: v for k, v in options.items()}}
        try:
            self._consumer = Consumer(config)
        except KafkaException as exc:
            raise BrokerError(f"Kafka at {servers}: {exc.args[0].str()}") from None
        self.topic, self._servers, self._timeout_s = topic, servers, timeout_s
        self._rewind, self._start = rewind, start   # (rewind: the module's docstring)
        self._tag = f"zbus: wound back ({rewind_id})" if rewind is not None else ""
        self._marks: dict[int, Watermark] = {}
        self.acked_below: int | None = None   # (a JetStream group's floor: not Kafka's)
        self._starts: dict[int, int] = {}   # an assigned partition's first offset to read
        # a revoked partition's floor here: everything below it is trained (its commit may
        # have been refused mid-rebalance); if it comes back, read on from there at least
        self._lapsed: dict[int, int] = {}
        # commits the group refused in a rebalance: their messages are delivered again to the
        # partitions' next owner (Kafka's at-least-once: a member fenced out cannot commit)
        self.commits_refused = 0
        # a revoke waits this long for the partitions' delivered messages to be done,
        # calling ``serve`` (the reader's: the loop's acknowledgements; False: stop waiting)
        self.settle_s = settle_s
        self.serve: Callable[[], bool] = lambda: False
        # (revokes so far, the partitions of the one under way): the feeder sets aside what
        # it read of them and has not begun to train (``forget``), the revoke waits for the rest
        self.revoking: tuple[int, frozenset[int]] = (0, frozenset())
        self._answered = 0   # the last revoke the feeder has answered (``forget``)
        self._closing = False
        # a cooperative assignor hands partitions over a few at a time: an assignment changed
        # in its callback is made with incremental_assign
        self._cooperative = "cooperative" in str(options.get("partition.assignment.strategy",
                                                             ""))
        try:
            topics = self._consumer.list_topics(topic, timeout=timeout_s).topics
        except KafkaException as exc:
            self._consumer.close()
            raise BrokerError(f"Kafka at {servers}: {exc.args[0].str()}") from None
        if topic not in topics or topics[topic].error is not None:
            self._consumer.close()
            raise BrokerError(f"Kafka at {servers}: no topic {topic!r}")
        self._consumer.subscribe([topic], on_assign=self._assigned, on_revoke=self._revoked,
                                 on_lost=self._lost)

    def _assigned(self, consumer: Any, partitions: list[Any]) -> None:
        log.info("Kafka: partition(s) %s of %s assigned to this feeder",
                 [tp.partition for tp in partitions], self.topic)
        for tp in partitions:
            self._marks[tp.partition] = Watermark()
            self._starts.pop(tp.partition, None)
        if self._rewind is not None:   # a job gone back to a checkpoint: read from there
            self._wind_back(consumer, partitions, self._rewind)
        moved = self._read_on(consumer, partitions)   # (after the wind back: past it too)
        if self._rewind is not None or moved:
            if self._cooperative:
                consumer.incremental_assign(partitions)
            else:
                consumer.assign(partitions)

    def _read_on(self, consumer: Any, partitions: list[Any]) -> bool:
        """A partition back at this feeder after a revoke whose commit the group refused:
        read on past what was trained here (its floor then), not from an older commit, and
        commit that; whether any moved."""
        from confluent_kafka import KafkaException, TopicPartition
        lapsed = {tp.partition: self._lapsed.pop(tp.partition) for tp in partitions
                  if tp.partition in self._lapsed}
        if not lapsed:
            return False
        try:
            committed = {c.partition: c.offset for c in consumer.committed(
                [TopicPartition(self.topic, p) for p in lapsed], timeout=self._timeout_s)}
        except KafkaException as exc:   # not known: from the commit (trained again)
            log.warning("Kafka: committed offsets: %s", exc.args[0].str())
            return False
        moved = []
        for tp in partitions:
            at = lapsed.get(tp.partition)
            start = tp.offset if tp.offset >= 0 else max(committed.get(tp.partition, 0), 0)
            if at is not None and at > start:
                tp.offset = self._starts[tp.partition] = at
                moved.append(TopicPartition(self.topic, tp.partition, at, metadata=self._tag)
                             if self._tag else TopicPartition(self.topic, tp.partition, at))
        if moved:
            log.info("Kafka: partition(s) %s back at this feeder: read on from %s, past what "
                     "it trained", [tp.partition for tp in moved], [tp.offset for tp in moved])
            try:
                consumer.commit(offsets=moved, asynchronous=False)
            except KafkaException as exc:
                self.commits_refused += 1
                log.warning("Kafka: the offsets read on from not committed: %s",
                            exc.args[0].str())
        return bool(moved)

    def _wind_back(self, consumer: Any, partitions: list[Any], rewind: dict[int, int]) -> None:
        """Set each partition's first offset to the checkpoint's, and commit it named after
        the roll back, unless its commit is named so already (the module's docstring). A
        partition the checkpoint does not name: from its start or its end, as ``start``
        says. (In librdkafka's rebalance callback: a failure is said and the partition wound
        back all the same, never raised.)"""
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaException, TopicPartition
        try:
            committed = consumer.committed(
                [TopicPartition(self.topic, tp.partition) for tp in partitions],
                timeout=self._timeout_s)
        except KafkaException as exc:   # not known: wound back (what another feeder trained
            log.warning("Kafka: committed offsets: %s", exc.args[0].str())   # since: again)
            committed = []
        wound_by = {c.partition: c.metadata for c in committed}
        wound = []
        for tp in partitions:
            if wound_by.get(tp.partition) == self._tag:
                continue   # wound back in this roll back already: on from its commit
            first = rewind.get(tp.partition)
            if first is None:
                try:
                    low, high = consumer.get_watermark_offsets(
                        TopicPartition(self.topic, tp.partition), timeout=self._timeout_s)
                    first = low if self._start == "earliest" else high
                except KafkaException:
                    tp.offset = OFFSET_BEGINNING if self._start == "earliest" else OFFSET_END
                    continue
            tp.offset = self._starts[tp.partition] = int(first)
            wound.append(TopicPartition(self.topic, tp.partition, tp.offset,
                                        metadata=self._tag))
        if wound:
            log.info("Kafka: partition(s) %s read again from the checkpoint at %s",
                     [tp.partition for tp in wound], [tp.offset for tp in wound])
            try:
                consumer.commit(offsets=wound, asynchronous=False)
            except KafkaException as exc:   # a later owner winds them back again
                self.commits_refused += 1
                log.warning("Kafka: the wound-back offsets not committed: %s",
                            exc.args[0].str())

    def _revoked(self, consumer: Any, partitions: list[Any]) -> None:
        revoked = [tp.partition for tp in partitions]
        log.info("Kafka: partition(s) %s of %s revoked (%s)", revoked, self.topic,
                 {p: (m.floor, m.pending()) for p, m in self._marks.items()})
        left, timed_out = self._settle(revoked)
        if left and timed_out:   # (a reader stopping, or none: nothing more is trained)
            self.commits_refused += 1
            log.warning("Kafka: %d message(s) of partition(s) %s read by this feeder and not "
                        "trained when their revoke ended (it waits up to %.0f s): their next "
                        "owner reads them again (trained twice if this feeder trains them)",
                        left, revoked, self.settle_s)
        self._commit(revoked)
        for tp in partitions:
            mark = self._marks.pop(tp.partition, None)
            if mark is not None and mark.floor is not None:
                self._lapsed[tp.partition] = mark.floor

    def _settle(self, partitions: list[int], done: bool = True) -> tuple[int, bool]:
        """Say the revoke of ``partitions`` (``revoking``) and wait, up to ``settle_s``,
        serving the loop's acknowledgements, until the feeder has answered it (set aside
        what it has not begun: ``forget``) and, with ``done``, every other message of them
        delivered here is done; the messages still not done, and whether the wait timed
        out."""
        count = self.revoking[0] + 1
        self.revoking = (count, frozenset(partitions))

        def left() -> int:
            return sum(self._marks[p].pending() for p in partitions if p in self._marks) \
                if done else 0
        deadline = time.monotonic() + self.settle_s
        timed_out = False
        try:
            while not self._closing and (self._answered < count or left()):
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
                if not self.serve():
                    break
                time.sleep(0.005)
        finally:
            self.revoking = (count, frozenset())
        return left(), timed_out

    def forget(self, deliveries: list[Delivery], revoke: int) -> None:
        """The feeder's answer to the revoke numbered ``revoke``: these messages were read
        and set aside untrained (their partition revoked): not waited for; the partition's
        next owner reads them from the commit."""
        for d in deliveries:
            mark = self._marks.get(d.partition)
            if mark is not None:
                mark.forget([d.position])
        self._answered = max(self._answered, revoke)

    def _lost(self, consumer: Any, partitions: list[Any]) -> None:
        """The group gave these partitions to another feeder (this one was fenced out): what
        the feeder read of them and has not begun is set aside (the revoke's answer waited
        for), nothing waited for nor committed."""
        lost = [tp.partition for tp in partitions]
        log.info("Kafka: partition(s) %s of %s lost to the group", lost, self.topic)
        self._settle(lost, done=False)
        for tp in partitions:        # another feeder owns them already: commit nothing
            self._marks.pop(tp.partition, None)

    def fetch(self, max_messages: int, timeout_s: float) -> list[Delivery]:
        out = []
        for m in self._consumer.consume(max_messages, timeout_s):
            if m.error() is not None:   # end of partition, a broker going: the client goes on
                continue
            partition, offset = m.partition(), m.offset()
            assert partition is not None and offset is not None   # (a message, not an event)
            self._marks.setdefault(partition, Watermark()).delivered(offset)
            out.append(Delivery(partition, offset, m.value() or b"", m.timestamp()[1] / 1000.0))
        return out

    def done(self, deliveries: list[Delivery]) -> None:
        """Commit, per partition, the offset after its done prefix, asynchronously: a
        synchronous commit waits on the fetch the reader thread has under way (up to its
        wait; measured: 262 events/s on the Adult stream against thousands). A commit lost
        with a crash delivers its messages again; ``settle`` and a revoke commit
        synchronously."""
        moved = {d.partition for d in deliveries
                 if d.partition in self._marks and self._marks[d.partition].done(d.position)}
        self._commit(sorted(moved), asynchronous=True)

    def settle(self) -> None:
        """Every done prefix committed, synchronously (the end of a pass)."""
        self._commit(sorted(self._marks))

    def _commit(self, partitions: list[int], asynchronous: bool = False) -> None:
        from confluent_kafka import KafkaException, TopicPartition
        floors = {p: self._marks[p].floor for p in partitions if p in self._marks}
        offsets = [TopicPartition(self.topic, p, floor, metadata=self._tag)
                   if self._tag else TopicPartition(self.topic, p, floor)
                   for p, floor in floors.items() if floor is not None]
        if not offsets:
            return
        try:
            if asynchronous:
                self._consumer.commit(offsets=offsets, asynchronous=True)
            else:
                self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            from confluent_kafka import KafkaError
            if exc.args[0].code() in (KafkaError.REBALANCE_IN_PROGRESS,
                                      KafkaError.ILLEGAL_GENERATION,
                                      KafkaError.UNKNOWN_MEMBER_ID,
                                      KafkaError._DESTROY):   # (closing: what close
                                                              # committed first stands)
                # the group is rebalancing, or dropped this member and it joins again:
                # committed at the revoke, or the next done (the new owner of a partition
                # this member lost starts at the last commit: nothing is acked that was not)
                self.commits_refused += 1
                return
            raise BrokerError(f"Kafka at {self._servers}: commit: {exc.args[0].str()}") \
                from None

    def working(self, deliveries: list[Delivery]) -> None:
        """Nothing to say: a partition's messages are not delivered to another member of the
        group while this one holds the partition."""

    def lag(self) -> dict[int, int]:
        """Per partition this feeder owns: the messages after its done prefix (what it
        commits), against the partition's end as the last fetch saw it (librdkafka's cached
        watermarks: no round trip; one of at most a second when none is cached). Asking the
        group coordinator for the committed offsets each second held the reader's fetches
        up for seconds at a time against the mock cluster."""
        from confluent_kafka import TopicPartition
        out = {}
        for p, mark in sorted(self._marks.items()):
            tp = TopicPartition(self.topic, p)
            low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if high < 0:
                low, high = self._consumer.get_watermark_offsets(
                    tp, timeout=min(1.0, self._timeout_s))
            floor = mark.floor if mark.floor is not None else self._start_of(p, low, high)
            out[p] = max(0, high - floor)
        return out

    def _start_of(self, partition: int, low: int, high: int) -> int:
        """Where this member reads ``partition`` from while nothing of it is delivered: its
        committed offset (one round trip, once an assignment), else where ``start`` says."""
        if partition not in self._starts:
            from confluent_kafka import TopicPartition
            (tp,) = self._consumer.committed([TopicPartition(self.topic, partition)],
                                             timeout=min(1.0, self._timeout_s))
            self._starts[partition] = tp.offset if tp.offset >= 0 else \
                (low if self._start == "earliest" else high)
        return self._starts[partition]

    def close(self) -> None:
        """Leave the group (its partitions go to the other feeders), what is done committed
        first (the revoke as the handle closes can no longer commit); nothing is committed
        that is not done, and nothing is waited for."""
        self._closing = True
        try:
            self._commit(sorted(self._marks))
        except BrokerError as exc:   # not committed: delivered again to the next owner
            log.warning("%s", exc)
        self._consumer.close()
