"""What interrupted the job, in the words of its reason, from the signal control received.

Under ``honcho start`` a person's Ctrl-C reaches honcho alone (each role runs in a session of
its own), which SIGTERMs every process; it does the same when one of its processes ends. So a
SIGTERM under honcho (``HONCHO_PROCESS_NAME``) is a Ctrl-C, unless a node of the job on this
host had already exited on its own when it came: then honcho stopped the job because that node
ended. A node that a signal stopped says so as it leaves (``Leaving.signal``): honcho's SIGTERM
reaches every process at once, and one may be gone before control's handler runs. So control
decides a moment after the signal (``SETTLE_S``), once such nodes' words have arrived.
Elsewhere the signal is all control knows (a SIGINT from a terminal, a SIGTERM from a
supervisor or a person).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from roles.algorithms.control.membership import ALIVE, NodeState
from roles.control.closing import exited

SETTLE_S = 0.3   # after the signal: the time a node stopped by it has to say so


def under_honcho(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("HONCHO_PROCESS_NAME"))


def interruption(signal_name: str, honcho: bool, gone: Iterable[str]) -> str:
    """The reason of a job interrupted by ``signal_name``; ``gone``: the nodes that had
    exited on their own when it came."""
    if not honcho or signal_name != "SIGTERM":
        return f"control received {signal_name} before the job finished"
    gone = sorted(gone)
    if gone:
        return (f"honcho stopped every process (SIGTERM) after {', '.join(gone)} exited, "
                "before the job finished")
    return "Ctrl-C: honcho stopped every process (SIGTERM) before the job finished"


@dataclass
class Interruption:
    """A signal reached control at ``at``: the nodes of this host already exited then
    (``gone``, as control knows them: one that says later that a signal stopped it, its
    ``signalled``, did not end on its own)."""

    signal_name: str
    honcho: bool
    at: float
    gone: dict[str, NodeState]

    @classmethod
    def begin(cls, signal_name: str, honcho: bool, nodes: Mapping[str, NodeState],
              now: float) -> Interruption:
        gone = {n: node for n, node in nodes.items() if node.status == ALIVE and exited(node)}
        return cls(signal_name, honcho, now, gone)

    def settled(self, now: float) -> bool:
        """The nodes a signal stopped have had their moment to say so."""
        return not (self.honcho and self.gone) or now >= self.at + SETTLE_S

    def reason(self) -> str:
        return interruption(self.signal_name, self.honcho,
                            [n for n, node in self.gone.items() if not node.signalled])
