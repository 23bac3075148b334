"""A node that could not start (its Hello says why: ``zbus.unstarted``): what it means to the job.

A node of this job that cannot start fails the job, its line the reason: at the job's start
for good (the same start meets the same), later (a shard, a feeder, an aggregator started again
on a host that cannot run it) so that a resume may go on from the newest checkpoint. A worker
beyond the job's own (one joining a running job) that cannot start only goes unadmitted: the
job goes on without it. A Hello that another job's node or a name this job does not know sends
is refused, as any Hello would be.
"""

from __future__ import annotations

from dataclasses import dataclass

from roles.algorithms.control.membership import Members
from zbus.messages import Hello


@dataclass(frozen=True)
class StartFailure:
    """``refuse``: answer the node with a refusal saying ``reason``, the job goes on; else
    the job fails with ``reason`` (``resumable`` as said above)."""

    refuse: bool
    reason: str
    resumable: bool = False


def start_failure(members: Members, fingerprint: str, node_id: str, hello: Hello,
                  starting: bool) -> StartFailure:
    """What control does with ``hello`` (``hello.failed`` set) from ``node_id``; ``starting``:
    the job has not begun training (its phase is ``starting``)."""
    refusal = members.refusal(node_id, hello.role, hello.index, hello.pid)
    if not refusal and hello.fingerprint != fingerprint:
        refusal = f"{node_id} runs a different job (fingerprint {hello.fingerprint})"
    if refusal:
        return StartFailure(True, refusal)
    said = f"{node_id} cannot start: {hello.failed}"
    if node_id not in members.expected:   # a worker joining a running job
        return StartFailure(True, f"{said} (the job goes on without it)")
    return StartFailure(False, said, resumable=not starting)
