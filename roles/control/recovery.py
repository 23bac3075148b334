"""Control's part in keeping the dense weights and the shards alive: the backups the
aggregator reports, the restore of a restarted aggregator, and a restarted shard.

An aggregator that dies (in sync modes that allow it, see ``roles.control.sync_modes``) is
declared failed when it misses heartbeats, and the job waits up to ``recovery_timeout_s`` for
it to be started again; once it is ready, every aggregator restores the latest backup as the
round last called, under a new generation (``Restore``, standing), and a round in flight is
void.

A shard that dies is declared failed likewise, and the job waits for it. The new process
restores its rows from the newest complete whole-job checkpoint (``roles.control.checkpoints``,
every ``[checkpoint] every_s``) and says Ready; control then
publishes ``ShardBack``, and feeders send it the keys of their batches in flight again while
workers repeat the look-ups it had not answered. The embedding updates it applied after that
checkpoint are lost: the restarted shard counts them exactly from its log of applied batches
(``updates_lost`` in the summary's ``shard_recoveries``, with the checkpoint's age and the time
it was down). A shard declared failed that speaks again was only stalled: it goes on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from roles.algorithms.control.membership import ALIVE, Members, NodeState
from roles.control.commands import Commands, ProgressClock
from roles.job.rundir import MetricsLog
from roles.job.settings import Job
from roles.protocol.dense_sync import BackupNow, BackupWritten, Restore, Restored
from roles.protocol.lifecycle import ShardBack
from zbus.endpoints import node_index

log = logging.getLogger(__name__)
BACKUP_RECORDS_KEPT = 100   # the newest backups' records (the count covers all)


def shard_recovery(lost_at: float, back_at: float, info: dict) -> dict:
    """What a shard's restart cost: how long it was away, how old its checkpoint was, and how
    many updates its dead process had applied after that checkpoint (lost with it: counted by
    the shard from its log of applied batches; None from a shard that did not say)."""
    lost = info.get("updates_lost")
    return {"down_s": round(back_at - lost_at, 3), "restored": info.get("restored") is True,
            "checkpoint_age_s": info.get("checkpoint_age_s"),
            "checkpoint": info.get("checkpoint"),
            "checkpoint_updates": info.get("checkpoint_updates"),
            "updates_lost": lost if isinstance(lost, int) and lost >= 0 else None}


def recovery_counts(*, aggregator: list, shard: list, feeder: list, feeder_handover: list,
                    rollback: list) -> dict[str, int]:
    """Every recovery of the job so far, by kind (the status's and the summary's
    ``recovered``): the aggregators restored from a backup, a shard restarted from the
    checkpoint, the last feeder restarted from its ack log, a lost feeder's parts handed to
    another, the whole job resumed from a checkpoint."""
    return {"aggregator": len(aggregator), "shard": len(shard), "feeder": len(feeder),
            "feeder_handover": len(feeder_handover), "rollback": len(rollback)}


def restored_from(record: dict) -> str:
    """What a shard came back with and what it lost, for a person (from its record)."""
    lost = record["updates_lost"]
    if lost is None and not record["restored"]:
        lost = 0  # counted from the start: none applied
    said = "an unknown number of" if lost is None else f"{lost:,}"
    if not record["restored"]:
        return (f"with no checkpoint to restore (none was complete): its table starts empty, "
                f"{said} embedding updates lost")
    age = record["checkpoint_age_s"]
    old = "" if age is None else f", {age:.1f} s old"
    return f"from checkpoint {record['checkpoint']}{old}: {said} embedding updates lost"


@dataclass
class RecoveryState:
    generation: int = 0              # aggregator restores so far
    shard_generation: int = 0        # shard restarts so far
    backup_request: int = 0
    aggregator_lost: bool = False
    shards_lost: list[str] = field(default_factory=list)
    shards_back: dict[str, int] = field(default_factory=dict)  # restarting: updates before


class Recovery:
    def __init__(self, job: Job, members: Members, commands: Commands, metrics: MetricsLog,
                 progress: ProgressClock):
        self.job = job
        self.members = members
        self.commands = commands
        self.metrics = metrics
        self.progress = progress
        self.backups: list[dict] = []   # the newest BACKUP_RECORDS_KEPT
        self.backups_written = 0
        self.backup_request = 0
        self.generation = 0
        self.recoveries: list[dict] = []
        self.aggregator_lost_at: float | None = None
        self.shards_lost: dict[str, float] = {}   # shard -> when declared failed
        # restarting: since when, and its update count at its last heartbeat (kept in the
        # state file as before; the exact loss comes from the shard)
        self.shards_back: dict[str, tuple[float, int]] = {}
        self.shard_generation = 0
        self.shard_recoveries: list[dict] = []

    # -- backups and the aggregator ------------------------------------------------------------
    def backup_written(self, node_id: str, m: BackupWritten) -> None:
        record = {"round": m.round, "path": m.path, "change": m.change if m.change >= 0
                  else None, "generation": self.generation}
        self.backups = [*self.backups, record][-BACKUP_RECORDS_KEPT:]
        self.backups_written += 1
        self.metrics.write("backup", node=node_id, **record)

    def backup_now(self) -> None:
        """An operator asked: the aggregator writes a backup whatever the change."""
        self.backup_request += 1
        self.commands.publish(BackupNow(request=self.backup_request), "backup")

    def newest_backup(self) -> dict | None:
        """The record (round, path, change, generation) of the newest backup reported, or None."""
        return max(self.backups, key=lambda b: b["round"]) if self.backups else None

    def latest_backup(self) -> str:
        """The newest backup the aggregator reported ('' when none: it finds its own)."""
        newest = self.newest_backup()
        return newest["path"] if newest else ""

    def aggregator_down(self, now: float) -> None:
        """The aggregator died or was started again: the rounds wait for its restore."""
        self.aggregator_lost_at = self.aggregator_lost_at or now

    def restore(self, round_: int) -> None:
        """An aggregator restarted: every aggregator goes back to the latest backup, published
        as the round last called, under a new generation."""
        self.generation += 1
        path = self.latest_backup()
        log.warning("recovery %d: the aggregators restore %s as round %d", self.generation,
                    path or "the latest backup on disk", round_)
        self.metrics.write("restore", generation=self.generation, round=round_, path=path)
        self.commands.publish(Restore(generation=self.generation, round=round_, path=path),
                              "restore")

    def restored(self, m: Restored, now: float, round_in_flight: bool) -> bool:
        """The aggregator published the backup: True when this ends a recovery (a round in
        flight is then void: its contributions died). The Restore command stands: a worker
        that missed the restored weights' broadcast asks for them as long as it sees a newer
        generation than its own."""
        if m.generation != self.generation or self.aggregator_lost_at is None:
            return False
        lost, self.aggregator_lost_at = self.aggregator_lost_at, None
        backup = self.newest_backup()
        self.recoveries.append({"generation": m.generation, "round": m.round,
                                "path": self.latest_backup(),
                                "backup_round": backup["round"] if backup else None,
                                "seconds": round(now - lost, 3) if lost else None,
                                "round_in_flight": round_in_flight})
        self.metrics.write("restored", **self.recoveries[-1])
        log.info("recovered: the aggregator published the backup as round %d", m.round)
        self.progress.touch(now)
        return True

    # -- shards ---------------------------------------------------------------------------------
    def shard_silent(self, node_id: str, reason: str, now: float) -> None:
        log.warning("%s; waiting up to %.0f s for it to restart from its checkpoint",
                    reason, self.job.train.recovery_timeout_s)
        self.members.fail(node_id, now, reason)
        self.shards_lost.setdefault(node_id, now)
        self.metrics.write("shard_lost", node=node_id, reason=reason)

    def shard_speaks(self, node_id: str, node: NodeState) -> None:
        """A shard declared failed that speaks again was only stalled, not dead: it still holds
        every row and batch, so it goes on (a restarted one says Hello instead)."""
        if node_id in self.shards_lost and node_id not in self.shards_back:
            log.warning("%s speaks again: it was stalled, not dead; it goes on", node_id)
            node.status = ALIVE
            del self.shards_lost[node_id]
            self.metrics.write("shard_stalled", node=node_id)

    def shard_restarting(self, node_id: str, before: NodeState, now: float) -> None:
        """A new process says Hello as a shard that had been ready."""
        updates = before.counters.get("updates")
        self.shards_back[node_id] = (self.shards_lost.pop(node_id, now),
                                     updates if isinstance(updates, int) else 0)
        log.warning("%s restarted: it restores its latest checkpoint", node_id)

    def shard_back(self, node_id: str, info: dict, now: float) -> None:
        lost_at, _ = self.shards_back.pop(node_id)
        self.shard_generation += 1
        record = {"shard": node_id, "generation": self.shard_generation,
                  "checkpoint_every_s": self.job.checkpoint.every_s,
                  **shard_recovery(lost_at, now, info)}
        self.shard_recoveries.append(record)
        self.metrics.write("shard_recovered", **record)
        log.warning("%s is back after %.1f s %s", node_id, record["down_s"],
                    restored_from(record))
        self.progress.touch(now)
        index = node_index(node_id)
        self.commands.publish(ShardBack(shard=index, generation=self.shard_generation),
                              f"shard_back-{index}")

    def overdue(self, now: float, feeders_down: dict[str, float]) -> str | None:
        """Why the job cannot wait any longer for a restart, or None."""
        limit = self.job.train.recovery_timeout_s
        late = [n for n, t in (*self.shards_lost.items(), *feeders_down.items())
                if now - t > limit]
        if late:
            return f"{late[0]} did not come back within recovery_timeout_s = {limit:.0f} s"
        if self.aggregator_lost_at is not None and now - self.aggregator_lost_at > limit:
            return f"the aggregator did not come back within recovery_timeout_s = {limit:.0f} s"
        return None

    # -- state -----------------------------------------------------------------------------------
    def to_state(self) -> RecoveryState:
        return RecoveryState(self.generation, self.shard_generation, self.backup_request,
                             self.aggregator_lost_at is not None, sorted(self.shards_lost),
                             {n: u for n, (_, u) in self.shards_back.items()})

    def from_state(self, s: RecoveryState, now: float) -> None:
        """A resumed control: what was timed from the dead process's clock is timed again from
        now."""
        self.generation, self.shard_generation = s.generation, s.shard_generation
        self.backup_request = s.backup_request
        self.aggregator_lost_at = now if s.aggregator_lost else None
        self.shards_lost = dict.fromkeys(s.shards_lost, now)
        self.shards_back = {n: (now, u) for n, u in s.shards_back.items()}
