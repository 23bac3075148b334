"""What a signal means to a role's process: the job's end, or this process's restart.

SIGINT (Ctrl-C) always stops: control ends the job as ``interrupted``, resumable from its
newest complete checkpoint, and tells every node to stop. So does SIGTERM, as honcho sends it
to every role on Ctrl-C and a spawner or a shell's ``kill`` to one; unless the process runs in a
pod that is going away. ``zbus-pod`` sets ``ZBUS_SIGTERM=restart`` for the role it runs
(``roles.tools.pod``): a SIGTERM there comes from Kubernetes (an eviction, a node drain, a
rolling update, ``kubectl delete pod``, a failed liveness probe), and it is that role's
restart, as if it had died, not the job's end: control hands its records over to the control
that comes next instead of stopping the nodes (``roles.control.process``), and a node stops
as a killed one would (control recovers it as a restart of its role).

Any other value of ``ZBUS_SIGTERM`` (``stop``, unset) keeps the stopping meaning.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

ENV = "ZBUS_SIGTERM"
STOP = "stop"          # the job ends (resumable when it can be)
RESTART = "restart"    # this process is restarted; the job goes on


def meaning(signum: int, environ: Mapping[str, str] | None = None) -> str:
    """``STOP`` or ``RESTART``: what signal ``signum`` asks of this process."""
    env = os.environ if environ is None else environ
    if signum == signal.SIGTERM and env.get(ENV, "") == RESTART:
        return RESTART
    return STOP
