"""A resumed control's first decision: go on with the nodes that live, or take the whole job
back to its newest complete checkpoint.

A node that lived through control's death answers control's first word with Hello naming the
run (it rejoins); a process started anew says Hello with no run. So: the first rejoin means
the nodes live on, and control goes on from its own latest records (a new process among them
is a restarted node, recovered as usual). If instead every node that holds state (every
feeder, shard and aggregator of the job) says Hello anew and none rejoins, the whole job was
killed: control goes back to the checkpoint, and so does every node (Welcome ``rollback``).
Until it has decided, control leaves the new nodes' Hellos unanswered (they say it again).

A control whose run directory is gone (a new machine, a rescheduled pod) takes its records from
the newest complete checkpoint in the checkpoint store (``records_from``): they are older than
what live nodes hold, so it cannot go on with them. It refuses a node that rejoins (the node
exits; started again, it says Hello anew) and goes back to the checkpoint once every stateful
node has.
"""

from __future__ import annotations

STATEFUL_ROLES = ("feeder", "ps", "aggregator")


class Resuming:
    def __init__(self, expected: list[str], resumed: bool):
        self.stateful = {n for n in expected if n.rsplit("-", 1)[0] in STATEFUL_ROLES}
        self.pending = resumed       # a resumed control that has not decided yet
        self.rolled_back = False     # decided: the whole job went back to a checkpoint
        self.fresh: set[str] = set()
        self.checkpoint = 0          # the records came from this checkpoint: no rejoin

    def records_from(self, checkpoint: int) -> None:
        self.checkpoint = checkpoint

    def hello(self, node_id: str, role: str, rejoin: bool) -> str:
        """``go``: handle the Hello as usual; ``wait``: leave it unanswered for now;
        ``roll back``: every stateful node is new, go back to the checkpoint (then ``go``);
        ``refuse``: a node of the run rejoins a control whose records came from a checkpoint."""
        if not self.pending:
            return "go"
        if rejoin and self.checkpoint:
            return "refuse"
        if rejoin:
            self.pending = False
            return "go"
        if role in STATEFUL_ROLES:
            self.fresh.add(node_id)
        if self.fresh >= self.stateful:
            self.pending = False
            self.rolled_back = True
            return "roll back"
        return "wait"
