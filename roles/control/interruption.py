"""What interrupted the job, in the words of its reason, from the signal control received.

Under ``honcho start`` a person's Ctrl-C reaches honcho alone (each role runs in a session of
its own), which SIGTERMs every process; it does the same when one of its processes ends. So a
SIGTERM under honcho (``HONCHO_PROCESS_NAME``) is a Ctrl-C, unless a node of the job on this
host had already exited when it came: then honcho stopped the job because that node ended.
Elsewhere the signal is all control knows (a SIGINT from a terminal, a SIGTERM from a
supervisor or a person).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from roles.algorithms.control.membership import ALIVE, NodeState
from roles.control.closing import exited


def under_honcho(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("HONCHO_PROCESS_NAME"))


def interruption(signal_name: str, honcho: bool, nodes: Iterable[tuple[str, NodeState]]) -> str:
    """The reason of a job interrupted by ``signal_name``; ``nodes``: the job's nodes as
    control knows them when the signal came."""
    if not honcho or signal_name != "SIGTERM":
        return f"control received {signal_name} before the job finished"
    gone = sorted(n for n, node in nodes if node.status == ALIVE and exited(node))
    if gone:
        return (f"honcho stopped every process (SIGTERM) after {', '.join(gone)} exited, "
                "before the job finished")
    return "Ctrl-C: honcho stopped every process (SIGTERM) before the job finished"
