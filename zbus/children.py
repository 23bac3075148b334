"""What a child of a role process may keep of its parent, and how long it lives.

A role's children are a shard's forked checkpoint writer (``roles.checkpoint.background``)
and control's capacity trainer (``roles.control.capacity_training``, a spawned interpreter).
A child must not hold its parent's ports: a forked one closes every inherited descriptor it
does not need right after the fork (``close_inherited``; it never touches ZeroMQ's state,
whose I/O threads the fork did not copy), and a spawned one inherits none. And a child must
not outlive its parent: the parent ends it before it exits, and on Linux the kernel kills it
when the parent dies in any way, SIGKILL included (``die_with_parent``), so that once a run's
last process is gone every one of its ports is free and nothing of it still writes.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1   # linux/prctl.h


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux only), looked up once, in the parent: a forked child then calls
    it without loading anything."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def prepare() -> None:
    """In the parent, before it forks: what the child's ``die_with_parent`` needs."""
    _prctl()


def die_with_parent(parent: int) -> None:
    """In a child: SIGKILL when the parent process ``parent`` exits (Linux; elsewhere only the
    parent's own ending of it applies). A parent already gone ends the child now."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def close_inherited(keep: int) -> None:
    """In a forked child: close every descriptor but stdin, stdout, stderr and ``keep``."""
    top = os.sysconf("SC_OPEN_MAX")
    os.closerange(3, keep)
    os.closerange(keep + 1, max(top, keep + 1))
