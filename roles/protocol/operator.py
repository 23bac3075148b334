"""Operators (``zbus-ctl``, the console) and control: requests and replies on control's request
endpoint (DEALER -> ROUTER), the live settings and the feeding pause (control PUB), and the
status published for consoles (PUB, channel "status")."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from zbus.codec import Message, ProtocolError, array, message

# What an operator may ask control (ControlRequest.action)
ACTIONS = ("settings", "set", "export", "backup", "checkpoint", "aggregate", "pause", "resume",
           "stop")
# The version of the Status body's layout (keys listed in roles.algorithms.control.status); 2:
# tasks, waiting, final, checkpoint
STATUS_LAYOUT = 2



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
    header cap); its keys are listed in ``roles.algorithms.control.status`` and its ``"layout"`` key
    names their version, ``STATUS_LAYOUT``, which a console checks."""

    run_id: str
    body: np.ndarray = array("uint8", 1)

    def snapshot(self) -> dict[str, Any]:
        """The body as a dict; ProtocolError when it is not one JSON object."""
        try:
            value = orjson.loads(self.body.tobytes())
        except orjson.JSONDecodeError:
            raise ProtocolError("bad_body", "Status body is not JSON") from None
        if not isinstance(value, dict):
            raise ProtocolError("bad_body", "Status body is not a JSON object")
        return value

    @classmethod
    def of(cls, run_id: str, snapshot: dict[str, Any]) -> Status:
        return cls(run_id=run_id, body=np.frombuffer(orjson.dumps(snapshot), dtype=np.uint8))
