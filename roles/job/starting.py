"""Making a role's loop, or, when it cannot be made, the node that tells control why.

A role that cannot start (a port in use, no CUDA device, a network file that does not build or
run, a checkpoint it cannot read) is the job's failure, with its one line as the reason: its
entry point (``roles.job.cli.role_main``, and the in-process cluster's) says the line and runs
``zbus.unstarted.Unstarted`` instead of the role, which tells control and exits non-zero. An
error a role knows it may meet (``EXPECTED``) is its message alone; any other is a bug, and
its traceback goes to the log before the same one line goes to control.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

from roles.job.settings import Job
from roles.storage.fs import StorageError
from zbus.node import Loop
from zbus.unstarted import Unstarted

log = logging.getLogger(__name__)

# what a role's start may meet that is no bug: the environment (OSError: a port in use, a file
# gone; RuntimeError: no CUDA device) or the job (ValueError: a network that cannot run, data
# that cannot be read)
EXPECTED: tuple[type[Exception], ...] = (OSError, RuntimeError, ValueError, StorageError)


def why(exc: Exception) -> str:
    """The one line that says why a role could not start."""
    text = " ".join(str(exc).split())
    if isinstance(exc, EXPECTED) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def make_role(make: Callable[[], Loop], job: Job, role: str, index: int
              ) -> tuple[Loop, str]:
    """``make()``, or an ``Unstarted`` node of the same name that tells control why not; with
    it, the line that says why ("" when the role started). Raises what stops that node too (an
    ``OSError``: no key pair for an authenticated bus), when no node can reach control."""
    try:
        return make(), ""
    except Exception as exc:
        if not isinstance(exc, EXPECTED):
            log.exception("%s-%d could not start", role, index)
        abandon(exc)
        reason = why(exc)
    return Unstarted(job.cluster, role, index, job.fingerprint(), reason), reason


def abandon(exc: BaseException) -> None:
    """Close the sockets of every loop that was being made when ``exc`` was raised (the frames
    of its constructors hold it), so that the node that says why takes their place at once:
    its sockets' endpoints free, control's link to it not held by a half-made one."""
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        made: Any = frame.f_locals.get("self")
        if isinstance(made, Loop) and not made.ended:
            made.stopping = made.ended = True
            if made.curve is not None:
                made.curve.stop()
            made.ctx.destroy(linger=0)
