"""The sync modes (``[train] sync``) as the job sees them, one row each: which deaths a job in
that mode survives, and which shapes of the cluster it cannot run. The job's validation
(``Job.__post_init__``) reads the constraints; control's strategies
(``roles.control.sync_modes``) read the rest. How each side behaves in a mode is in its
strategies (``roles.control.sync_modes``, ``roles.algorithms.sync``).

A new constraint is a line in ``SHAPES`` and the reason in the row of each mode that cannot run
it; a new mode is a row here (and its strategies).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from roles.protocol.topology import ClusterConfig


@dataclass(frozen=True)
class SyncRules:
    aggregator_recovers: bool  # a dead aggregator may be restarted from a backup
    feeder_restarts: bool      # a dead feeder may be restarted from its ack log
    refuses: Mapping[str, str] = field(default_factory=dict)  # a shape (SHAPES) -> why not


# the shapes of the cluster some mode cannot run: how the job file says it, whether it is so
SHAPES: dict[str, tuple[str, Callable[[ClusterConfig], bool]]] = {
    "model parallel": ("[cluster] parts > 1 (model parallelism)", lambda c: c.parts > 1),
    "several feeders": ("[cluster] feeders > 1", lambda c: c.feeders > 1),
}

SYNC_MODES: dict[str, SyncRules] = {
    "step": SyncRules(aggregator_recovers=False, feeder_restarts=True, refuses={
        "model parallel": "the aggregator takes every step's whole gradient from one process"}),
    "every": SyncRules(aggregator_recovers=True, feeder_restarts=True),
    "round": SyncRules(aggregator_recovers=True, feeder_restarts=False, refuses={
        "several feeders": "one feeder's ledger counts every batch of a round"}),
    "lazy": SyncRules(aggregator_recovers=True, feeder_restarts=True),
}


def cluster_refusal(sync: str, cluster: ClusterConfig) -> str | None:
    """Why sync mode ``sync`` cannot run this cluster (the first shape it refuses), or None
    (an unknown mode too: the job file's reader refuses it by name)."""
    refuses = SYNC_MODES[sync].refuses if sync in SYNC_MODES else {}
    for shape, (says, holds) in SHAPES.items():
        why = refuses.get(shape)
        if why and holds(cluster):
            fits = [f'"{m}"' for m, rules in SYNC_MODES.items() if shape not in rules.refuses]
            return (f"{says} needs [train] sync = {', '.join(fits[:-1])} or {fits[-1]}: "
                    f"in sync mode {sync} {why}")
    return None
