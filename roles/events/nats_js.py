"""NATS JetStream as a stream job's source (the ``nats-py`` client).

A job's feeders share one durable pull consumer on the stream that holds the subject: each
message goes to one feeder (JetStream spreads a pull consumer's messages over its pullers, so
several feeders need no partitions, and one that dies needs no rebalance), and a message not
acknowledged within ``ack_wait_s`` (``[stream] ack_wait_s``, default 30) is delivered again,
to whichever feeder pulls next. Acknowledgement is explicit, per message (``AckExplicit``:
with feeders sharing the consumer, ``AckAll`` would acknowledge another feeder's messages);
``done`` sends the acks and flushes the connection, so that they have reached the server when
it returns. The client is asyncio's: it runs on a thread of its own, and this class's methods
wait for it.

A job gone back to a checkpoint makes the group's consumer anew, delivering from the
checkpoint's first position not done (``rewind``): what was acknowledged since comes again.
One feeder does it (``rewind_leads``: feeder 0), naming the roll back in the new consumer's
description (``rewind_id``); the others wait until the group's consumer has that name, then
pull from it: two feeders each making it anew would each deliver the stream again from there,
and the first one's pulls would be from a consumer deleted under it. A feeder that finds the
consumer named so already (started again within that roll back) does not make it again.

``acked_below`` is the group's floor as the server keeps it: every position below it is
acknowledged (by any feeder of the group); it is read when the consumer opens and at each
``lag``. Several feeders' records of a checkpoint meet there (``roles.events.positions``).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from roles.events import BrokerError, Delivery

ACK_WAIT_S = 30.0
MAX_ACK_PENDING = 100_000   # messages delivered to the group and not acknowledged
REWIND_WAIT_S = 120.0       # a feeder waits this long for feeder 0 to wind the group back


class _Loop:
    """An asyncio event loop on a thread of its own."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout_s: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except FutureTimeout:
            future.cancel()
            raise

    def open(self, coro: Any, urls: list[str], timeout_s: float) -> Any:
        """``coro``'s result (it connects to ``urls``); what fails as one BrokerError line,
        the loop closed."""
        try:
            return self.run(coro, timeout_s)
        except BaseException as exc:
            self.close()
            if isinstance(exc, BrokerError):
                raise
            raise BrokerError(f"NATS at {','.join(urls)}: {type(exc).__name__}: "
                              f"{str(exc) or f'no answer within {timeout_s:g} s'}") from None

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


class JetStreamConsumer:
    shared = True   # (the module's docstring: one durable consumer for the group's feeders)

    def __init__(self, servers: list[str], subject: str, group: str, start: str,
                 options: dict[str, object], ack_wait_s: float = ACK_WAIT_S,
                 connect_timeout_s: float = 10.0, rewind: dict[int, int] | None = None,
                 rewind_id: str = "", rewind_leads: bool = True):
        import nats
        from nats.aio.client import Client
        known = set(inspect.signature(Client.connect).parameters) - {"self", "servers"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise BrokerError(f"[stream.options] {', '.join(unknown)}: not options of the NATS "
                              f"client (it takes: {', '.join(sorted(known))})")
        self.subject, self.group = subject, group
        self._urls = [f"nats://{s}" for s in servers]
        self._messages: dict[int, Any] = {}   # position -> its message, until done
        self.acked_below: int | None = None    # the group's floor (the module's docstring)
        self.commits_refused = 0   # (an ack that fails raises)
        self.serve: Callable[[], bool] = lambda: False   # (no fetch waits on acks here)
        self.revoking: tuple[int, frozenset[int]] = (0, frozenset())   # (nothing is revoked)
        self._loop = _Loop(f"nats-{group}")
        wait_s = REWIND_WAIT_S if rewind is not None and not rewind_leads else 0.0
        self._nc, self._sub = self._loop.open(   # (the client tries again as long as let)
            self._open(nats, options, start, ack_wait_s, connect_timeout_s, rewind,
                       rewind_id, rewind_leads),
            self._urls, connect_timeout_s * 2 + wait_s)

    async def _open(self, nats: Any, options: dict[str, object], start: str,
                    ack_wait_s: float, connect_timeout_s: float,
                    rewind: dict[int, int] | None, rewind_id: str,
                    rewind_leads: bool) -> tuple[Any, Any]:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
        from nats.js.errors import NotFoundError
        nc = await nats.connect(servers=self._urls, connect_timeout=connect_timeout_s,
                                max_reconnect_attempts=-1, allow_reconnect=True, **options)
        js = nc.jetstream()
        try:
            stream = await js.find_stream_name_by_subject(self.subject)
        except NotFoundError:
            await nc.close()
            raise BrokerError(f"NATS at {','.join(self._urls)}: no JetStream stream holds "
                              f"the subject {self.subject!r}") from None
        policy = DeliverPolicy.ALL if start == "earliest" else DeliverPolicy.NEW
        first, description = None, None
        if rewind is not None:   # read again from there: the group's consumer made anew
            description = f"zbus: wound back ({rewind_id})"
            if not rewind_leads:
                await self._wound_back(nc, js, stream, description)
            elif await self._description(js, stream) != description:
                try:
                    await js.delete_consumer(stream, self.group)
                except NotFoundError:
                    pass
            if 0 in rewind:
                policy, first = DeliverPolicy.BY_START_SEQUENCE, max(1, int(rewind[0]))
        config = ConsumerConfig(
            durable_name=self.group, description=description, ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait_s, deliver_policy=policy, opt_start_seq=first,
            max_ack_pending=MAX_ACK_PENDING, filter_subject=self.subject)
        sub = await js.pull_subscribe(self.subject, durable=self.group, stream=stream,
                                      config=config)
        self.acked_below = _floor(await sub.consumer_info())
        return nc, sub

    async def _description(self, js: Any, stream: str) -> str | None:
        """The group's consumer's description (None: there is no such consumer)."""
        from nats.js.errors import NotFoundError
        try:
            info = await js.consumer_info(stream, self.group)
        except NotFoundError:
            return None
        return info.config.description or ""

    async def _wound_back(self, nc: Any, js: Any, stream: str, description: str) -> None:
        """Wait until feeder 0 has made the group's consumer anew for this roll back."""
        deadline = time.monotonic() + REWIND_WAIT_S
        while await self._description(js, stream) != description:
            if time.monotonic() > deadline:
                await nc.close()
                raise BrokerError(
                    f"NATS at {','.join(self._urls)}: the group {self.group!r} was not read "
                    f"again from the checkpoint within {REWIND_WAIT_S:g} s (feeder 0 makes "
                    "its consumer anew: is it running?)")
            await asyncio.sleep(0.1)

    def fetch(self, max_messages: int, timeout_s: float) -> list[Delivery]:
        """Up to ``max_messages`` messages, waiting at most ``timeout_s`` for the first."""
        return self._loop.run(self._fetch(max_messages, timeout_s), timeout_s + 10)

    async def _fetch(self, max_messages: int, timeout_s: float) -> list[Delivery]:
        import nats.errors
        if not self._nc.is_connected:   # the client reconnects by itself meanwhile
            await asyncio.sleep(min(timeout_s, 0.2))
            raise BrokerError(f"NATS at {','.join(self._urls)}: disconnected, reconnecting")
        try:
            # the client's own wait, bounded: a pull request that the server answered for
            # another puller of the group can leave it waiting (what it had taken stays in
            # the subscription's queue, the next fetch's first)
            messages = await asyncio.wait_for(
                self._sub.fetch(batch=max_messages, timeout=timeout_s), timeout_s + 1.0)
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        out = []
        for m in messages:
            meta = m.metadata
            self._messages[meta.sequence.stream] = m
            out.append(Delivery(0, meta.sequence.stream, m.data, meta.timestamp.timestamp(),
                                meta.num_delivered))
        return out

    def done(self, deliveries: list[Delivery]) -> None:
        """Acknowledge these messages (every event of each trained); returns once the server
        has them."""
        messages = [self._messages.pop(d.position) for d in deliveries
                    if d.position in self._messages]
        if messages:
            self._loop.run(self._ack(messages), 30)

    async def _ack(self, messages: list[Any]) -> None:
        for m in messages:
            await m.ack()
        await self._nc.flush()

    def settle(self) -> None:
        """Nothing waits: ``done`` returns once the server has the acks."""

    def forget(self, deliveries: list[Delivery], revoke: int) -> None:
        """(Nothing is revoked from a JetStream group's feeder: never asked.)"""

    def working(self, deliveries: list[Delivery]) -> None:
        """These messages are still being worked on: their ack wait starts again (an
        in-progress ack), so that the server does not deliver them to another puller."""
        messages = [self._messages[d.position] for d in deliveries
                    if d.position in self._messages]
        if messages:
            self._loop.run(self._progress(messages), 30)

    async def _progress(self, messages: list[Any]) -> None:
        for m in messages:
            await m.in_progress()
        await self._nc.flush()

    def lag(self) -> dict[int, int]:
        """Messages the stream holds for the group and not acknowledged (pending delivery, and
        delivered but not acknowledged)."""
        info = self._loop.run(self._sub.consumer_info(), 30)
        self.acked_below = _floor(info)
        return {0: int(info.num_pending) + int(info.num_ack_pending)}

    def close(self) -> None:
        """Leaves what is not acknowledged to be delivered again (after ``ack_wait_s``)."""
        try:
            self._loop.run(self._nc.close(), 10)
        except Exception:   # closing a connection that is already gone
            pass
        self._loop.close()


def _floor(info: Any) -> int | None:
    """The first stream position the group's acknowledgements have not all reached below."""
    floor = getattr(getattr(info, "ack_floor", None), "stream_seq", None)
    return None if floor is None else int(floor) + 1
