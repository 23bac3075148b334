"""The base node messages: how any node joins, reports its health and leaves (the transport's
own protocol; the application's messages are in ``roles.protocol``).

Node <-> control is DEALER -> ROUTER on channel "control"; Deciding, Finish and Stop come on
control's PUB.
"""

from __future__ import annotations

from typing import Any

from zbus.codec import Message, message


@message()
class Hello(Message):
    """A node announces itself to control; repeated until control answers with Welcome.
    ``run_id`` is empty from a new node; a node of a run that a restarted control asked to
    introduce itself again (Rejoin) gives the run and whether it was ready. ``failed``: the
    node could not start (``zbus.unstarted``), and why, in one line; control answers it with
    Stop or a refusing Welcome, never admits it."""

    role: str
    index: int
    host: str
    pid: int
    fingerprint: str  # hash of the node's effective job: every node must run the same job
    run_id: str = ""
    ready: bool = False
    failed: str = ""


@message()
class Welcome(Message):
    """Control's answer to Hello: admitted or not, and the run directory to write into.
    ``restore``: a directory the node's state is to be restored from, if the role restores
    any ("": none; the application says what it holds); ``rollback``: the whole run goes back
    to that state (every node restores from it), rather than this node alone;
    ``rollback_id``: that roll back's own name, the same in every node's Welcome of it and
    another at the next (nodes that share an outside resource, a broker's consumer, tell by it
    whether one of them has already wound that back)."""

    accepted: bool
    reason: str
    run_id: str
    run_dir: str
    restore: str = ""
    rollback: bool = False
    rollback_id: str = ""


@message()
class Rejoin(Message):
    """Control, started again on its run (``--resume``), does not know the node that spoke:
    the node says Hello again with its run, then sends its latest reports once more."""

    run_id: str


@message()
class Heartbeat(Message):
    """Periodic load and counters of a node. ``load``: cpu (percent), rss (bytes),
    net (interface -> [bytes sent, bytes received], cumulative); ``counters``: the role's own
    figures, including ``bytes_out``/``bytes_in`` per channel. ``final`` answers Finish."""

    role: str
    index: int
    state: str
    load: dict[str, Any]
    counters: dict[str, Any]
    final: bool


@message()
class Ready(Message):
    """A node finished its start-up (the feeder has loaded its data; ``info`` says what)."""

    info: dict[str, Any]


@message()
class Failure(Message):
    """A node cannot go on (bad data, a broken peer); control fails the job with the reason."""

    reason: str


@message()
class Leaving(Message):
    """A node leaves the job: the job is over, or a worker stops after finishing the batches
    it was granted. ``signal``: the signal that stopped it (``SIGTERM``), if one did; a node
    stopped by a signal says so as it goes, so that control can tell a process that ended on
    its own from one stopped with it (``roles.control.interruption``)."""

    reason: str
    signal: str = ""


@message()
class Probe(Message):
    """Control's periodic health probe: a node answers ProbeReply at once. A node that has not
    answered within ``probe_timeout_s`` counts towards the cluster failure rate."""

    nonce: int


@message()
class ProbeReply(Message):
    """A node's answer to control's Probe."""

    nonce: int


@message()
class Deciding(Message):
    """Control, started again on its run (``--resume``), has not decided yet whether the nodes
    live on or the whole job goes back to a checkpoint: until it has, it publishes this every
    heartbeat interval in place of its standing commands (which a roll back replaces: one of
    the dead run's, read by a node after its Welcome, would be taken as the new run's), so that
    a node waiting for its Welcome hears control and does not give up. Nodes ignore it."""


@message()
class Finish(Message):
    """Training and evaluation are over: every node sends a final Heartbeat."""


@message()
class Stop(Message):
    """The job ended (``ok`` says how); every node exits. ``resumable``: the run can be
    resumed from a checkpoint (control's next start goes back to it, with every node as a new
    process), so a node's supervisor should start it again; else the job has ended for good
    and a node's health says ``ended``."""

    ok: bool
    reason: str
    resumable: bool = False
