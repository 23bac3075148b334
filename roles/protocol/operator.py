"""Operators (``zbus-ctl``, the console) and control: requests and replies on control's request
endpoint (DEALER -> ROUTER), the live settings and the feeding pause (control PUB), and the
status published for consoles (PUB, channel "status"; its layout: ``roles.protocol.status``)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import orjson

from roles.protocol.status import STATUS_LAYOUT, StatusSnapshot
from zbus.codec import Message, ProtocolError, array, message

# What an operator may ask control (ControlRequest.action)
ACTIONS = ("settings", "set", "export", "backup", "checkpoint", "aggregate", "pause", "resume",
           "stop")

@message()
class ControlRequest(Message):
    """``action``: ``settings`` (read), ``set`` (apply ``changes``: name -> value), ``export``,
    ``backup``, ``checkpoint`` (a whole-job checkpoint now), ``aggregate`` (a round now), ``pause``
    / ``resume`` (feeding), ``stop`` (end the job)."""

    action: str
    changes: dict[str, Any]


@message()
class ControlReply(Message):
    """``ok`` and a message saying what happened (or why not); the effective live settings."""

    ok: bool
    message: str
    settings: dict[str, Any]


@message()
class Settings(Message):
    """The effective live settings (``roles.algorithms.shared.live``); ``version`` rises with every
    change."""

    version: int
    values: dict[str, Any]


@message()
class FeedingPaused(Message):
    """An operator paused (or resumed) the feeder: while ``paused`` it sends no new batch;
    batches already out are trained and acknowledged as usual."""

    paused: bool


@message("status")
class Status(Message):
    """Control's picture of the job for consoles, published every ``status_s`` (channel
    "status"). ``body`` is an orjson object in one uint8 frame (with many nodes it outgrows the
    header cap); its layout is ``roles.protocol.status.StatusSnapshot``, and its ``"layout"`` key
    names the layout's version, ``STATUS_LAYOUT``."""

    run_id: str
    body: np.ndarray = array("uint8", 1)

    def snapshot(self) -> StatusSnapshot:
        """The body; ProtocolError when it is not one JSON object of this layout's version
        with every key of the layout."""
        try:
            value = orjson.loads(self.body.tobytes())
        except orjson.JSONDecodeError:
            raise ProtocolError("bad_body", "Status body is not JSON") from None
        if not isinstance(value, dict):
            raise ProtocolError("bad_body", "Status body is not a JSON object")
        if value.get("layout") != STATUS_LAYOUT:
            raise ProtocolError("bad_body", f"status layout {value.get('layout')!r}, this "
                                            f"reader reads {STATUS_LAYOUT}")
        missing = sorted(StatusSnapshot.__required_keys__ - value.keys())
        if missing:
            raise ProtocolError("bad_body", f"status without {', '.join(missing)}")
        return cast(StatusSnapshot, value)

    @classmethod
    def of(cls, run_id: str, snapshot: StatusSnapshot) -> Status:
        return cls(run_id=run_id, body=np.frombuffer(orjson.dumps(snapshot), dtype=np.uint8))
