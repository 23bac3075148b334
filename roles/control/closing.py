"""The job has ended: control waits for the nodes to exit before it exits itself.

Control sends Stop, then waits up to ``CLOSE_WAIT_S`` until every node's process has exited
(on another host, where control cannot tell, until it said it leaves) and the processes that
started the nodes on this host (``zbus-spawn``, honcho's own for a Procfile line) have exited
too, so that honcho has said they stopped before control prints the run's headline, the run's
last output.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from roles.algorithms.control.membership import ALIVE, NodeState
from roles.job.summary import Summary
from zbus.messages import Stop

CLOSE_WAIT_S = 3.0         # after Stop, the nodes' time to leave before control exits
SAID_STOPPED_S = 0.3       # after the last of them exited: honcho's time to say so


@dataclass
class Closing:
    """The job has ended: its summary and where it was written, when control exits at the
    latest, the Stop the nodes were sent (a node that says Hello after it gets it too), the
    processes that started the nodes here, and when every one of them was seen gone."""

    summary: Summary
    path: Path
    deadline: float
    stop: Stop
    supervisors: list[psutil.Process]
    gone_at: float | None = None

    @classmethod
    def begin(cls, summary: Summary, path: Path, stop: Stop, nodes: Iterable[NodeState],
              now: float) -> Closing:
        return cls(summary, path, now + CLOSE_WAIT_S, stop, supervisors(nodes))

    def over(self, now: float, nodes: Iterable[NodeState]) -> bool:
        """Every node and supervisor has exited and honcho had its moment to say so, or the
        deadline has passed: control may exit."""
        gone = all(exited(n) for n in nodes) and not any(alive(p) for p in self.supervisors)
        if gone and self.gone_at is None:
            self.gone_at = now  # honcho reports an exit a moment after it
        grace = SAID_STOPPED_S if self.supervisors else 0.0   # nobody to say it otherwise
        return (self.gone_at is not None and now >= self.gone_at + grace) \
            or now >= self.deadline


def supervisors(nodes: Iterable[NodeState]) -> list[psutil.Process]:
    """The processes that started the nodes on this host and exit when they do: a
    ``zbus-spawn``, or honcho's process for a Procfile line (honcho says it stopped once it
    has exited); not a shell or a test that started control too."""
    found: dict[int, psutil.Process] = {}
    for node in nodes:
        if node.host != socket.gethostname():
            continue
        try:
            parent = psutil.Process(node.pid).parent()
            if parent is not None and parent.pid != os.getppid() and any(
                    "zbus-spawn" in part or "honcho" in part for part in parent.cmdline()):
                found[parent.pid] = parent
        except psutil.Error:
            continue
    return list(found.values())


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def exited(node: NodeState) -> bool:
    """The node's process has exited; on another host, where control cannot tell, it has
    said it leaves."""
    if node.host != socket.gethostname():
        return node.status != ALIVE
    try:
        return psutil.Process(node.pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True
