"""Event sources of a stream job: a broker's messages as ``Delivery`` values, told ``done``
once every event of a message is trained (docs/streams.md).

``open_consumer`` picks the client by the URL's scheme: ``nats://`` (NATS JetStream, the
``nats-py`` client: ``nats_js``) or ``kafka://`` (Kafka, ``confluent-kafka``: ``kafka``). A
consumer's ``fetch`` gives the next messages in the broker's order for each partition,
``done`` acknowledges messages to the broker (a JetStream ack, a Kafka commit of the offset
after the done prefix: ``watermark``; Kafka's asynchronous, ``settle`` waits for them),
``lag`` is the events the broker holds that are not acknowledged, per partition. A feeder
calls its consumer from one thread only, its reader's (``roles.events.reader``).
Acknowledging is the broker's side of exactly once; the job's own record of what is trained
(the ledger, in checkpoints) is the other: a message trained and not yet acknowledged when
its feeder dies comes again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class BrokerError(Exception):
    """A broker that cannot be reached, a topic or subject it does not have, an option its
    client refuses: one line, naming what was asked."""


@dataclass(frozen=True)
class Delivery:
    """One message: ``partition`` (Kafka's; 0 for a JetStream stream, whose sequence is one),
    ``position`` (Kafka's offset, JetStream's stream sequence), ``payload``, the broker's
    ``time_s`` for it (seconds since the epoch), and how many times it was delivered."""

    partition: int
    position: int
    payload: bytes
    time_s: float
    deliveries: int = 1


class Consumer(Protocol):
    # the group's feeders pull from one consumer, each message to one of them (JetStream's);
    # else each partition has one owner at a time (Kafka's)
    shared: bool
    # a shared consumer's group floor: every position below it is acknowledged by one of
    # the feeders (None: not known yet, or a partitioned consumer)
    acked_below: int | None
    # acknowledgements the broker refused without an error raised (Kafka's commits in a
    # rebalance); 0 where every refusal raises
    commits_refused: int
    # set by whoever calls ``fetch`` (the reader): serves the loop's acknowledgements while a
    # fetch waits for messages to be done (Kafka's revoke); False: stop waiting
    serve: Callable[[], bool]
    # (revokes so far, the partitions of the one under way): its messages read and not begun
    # are set aside (``forget``), the revoke waits for the rest to be done (Kafka's)
    revoking: tuple[int, frozenset[int]]

    def fetch(self, max_messages: int, timeout_s: float) -> list[Delivery]: ...

    def done(self, deliveries: list[Delivery]) -> None: ...

    def settle(self) -> None: ...

    def working(self, deliveries: list[Delivery]) -> None: ...

    def forget(self, deliveries: list[Delivery], revoke: int) -> None: ...

    def lag(self) -> dict[int, int]: ...

    def close(self) -> None: ...


def open_consumer(url: str, topic: str, group: str, start: str = "earliest",
                  options: dict[str, object] | None = None,
                  ack_wait_s: float = 30.0, rewind: dict[int, int] | None = None,
                  rewind_id: str = "", rewind_leads: bool = True) -> Consumer:
    """A consumer of ``topic`` for ``group`` (a durable consumer, a consumer group) at
    ``url``: ``nats://host:port[,host:port...]`` or ``kafka://host:port[,...]``; ``start``
    (``earliest`` or ``latest``) where a new group begins; ``options`` the client's own
    settings (credentials, TLS); ``ack_wait_s`` JetStream's AckWait; ``rewind`` (a job gone
    back to a checkpoint): the group reads again from these positions, by partition (a
    partition not named: from ``start``), whatever it acknowledged since; ``rewind_id`` names
    that roll back, and of a JetStream group's feeders the one that ``rewind_leads`` makes its
    consumer anew, the others wait for it (``nats_js``)."""
    if start not in ("earliest", "latest"):
        raise BrokerError(f"start must be 'earliest' or 'latest', got {start!r}")
    scheme, sep, hosts = url.partition("://")
    if not sep or not hosts:
        raise BrokerError(f"a stream url is nats://host:port or kafka://host:port, got {url!r}")
    if scheme == "nats":
        from roles.events.nats_js import JetStreamConsumer
        return JetStreamConsumer(hosts.split(","), topic, group, start, options or {},
                                 ack_wait_s=ack_wait_s, rewind=rewind, rewind_id=rewind_id,
                                 rewind_leads=rewind_leads)
    if scheme == "kafka":
        from roles.events.kafka import KafkaConsumer
        return KafkaConsumer(hosts, topic, group, start, options or {}, rewind=rewind,
                             rewind_id=rewind_id, settle_s=ack_wait_s)
    raise BrokerError(f"a stream url is nats:// or kafka://, got {scheme}://")
