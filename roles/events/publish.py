"""Putting events on a broker (``open_publisher``): what ``zbus-replay`` sends with, and what a
user's own producer does. ``publish`` returns once the broker has every message (JetStream's
PubAck, Kafka's delivery report), so that what was said sent is there.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Protocol

from roles.events import BrokerError
from roles.events.nats_js import _Loop

PIPELINE = 512   # JetStream publishes awaited at once


class Publisher(Protocol):
    def publish(self, payloads: list[bytes]) -> None: ...

    def close(self) -> None: ...


def open_publisher(url: str, topic: str, options: dict[str, object] | None = None,
                   create: bool = True) -> Publisher:
    """A publisher to ``topic`` at ``url`` (``nats://`` or ``kafka://``); on NATS, with
    ``create``, a stream is made for the subject when none holds it (named after it)."""
    scheme, sep, hosts = url.partition("://")
    if not sep or not hosts:
        raise BrokerError(f"a stream url is nats://host:port or kafka://host:port, got {url!r}")
    if scheme == "nats":
        return NatsPublisher(hosts.split(","), topic, options or {}, create)
    if scheme == "kafka":
        return KafkaPublisher(hosts, topic, options or {})
    raise BrokerError(f"a stream url is nats:// or kafka://, got {scheme}://")


def stream_name(subject: str) -> str:
    """The JetStream stream made for a subject: its name without what a name may not hold."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", subject) or "events"


class NatsPublisher:
    def __init__(self, servers: list[str], subject: str, options: dict[str, object],
                 create: bool, connect_timeout_s: float = 10.0):
        import nats
        self.subject = subject
        self._urls = [f"nats://{s}" for s in servers]
        self._loop = _Loop(f"nats-publish-{subject}")
        self._nc, self._js = self._loop.open(
            self._open(nats, options, create, connect_timeout_s), self._urls,
            connect_timeout_s * 2)

    async def _open(self, nats: Any, options: dict[str, object], create: bool,
                    connect_timeout_s: float) -> tuple[Any, Any]:
        from nats.js.errors import NotFoundError
        nc = await nats.connect(servers=self._urls, connect_timeout=connect_timeout_s,
                                max_reconnect_attempts=2, **options)
        js = nc.jetstream()
        try:
            await js.find_stream_name_by_subject(self.subject)
        except NotFoundError:
            if not create:
                await nc.close()
                raise BrokerError(f"NATS at {','.join(self._urls)}: no JetStream stream holds "
                                  f"the subject {self.subject!r}") from None
            await js.add_stream(name=stream_name(self.subject), subjects=[self.subject])
        return nc, js

    def publish(self, payloads: list[bytes]) -> None:
        self._loop.run(self._publish(payloads), 60 + len(payloads) * 0.01)

    async def _publish(self, payloads: list[bytes]) -> None:
        for i in range(0, len(payloads), PIPELINE):
            await asyncio.gather(*(self._js.publish(self.subject, p)
                                   for p in payloads[i:i + PIPELINE]))

    def close(self) -> None:
        try:
            self._loop.run(self._nc.drain(), 30)
        except Exception:   # a connection already gone has nothing left to send
            pass
        self._loop.close()


class KafkaPublisher:
    def __init__(self, hosts: str, topic: str, options: dict[str, object]):
        from confluent_kafka import KafkaException, Producer
        self.topic = topic
        self._errors: list[str] = []
        try:
            self._producer = Producer({"bootstrap.servers": hosts, "enable.idempotence": True,
                                       "linger.ms": 5, **options})
        except KafkaException as exc:
            raise BrokerError(f"Kafka at {hosts}: {exc.args[0].str()}") from None
        self._hosts = hosts

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None and len(self._errors) < 10:
            self._errors.append(err.str())

    def publish(self, payloads: list[bytes]) -> None:
        for p in payloads:
            while True:
                try:
                    self._producer.produce(self.topic, p, on_delivery=self._delivered)
                    break
                except BufferError:   # the client's queue is full: let it send
                    self._producer.poll(0.1)
            self._producer.poll(0)
        left = self._producer.flush(60)
        if self._errors or left:
            raise BrokerError(f"Kafka at {self._hosts}, topic {self.topic!r}: "
                              f"{'; '.join(self._errors) or f'{left} messages not delivered'}")

    def close(self) -> None:
        self._producer.flush(10)
