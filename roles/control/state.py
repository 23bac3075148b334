"""Control's state on disk, mixed into Control, so that a control killed mid-job can be started
again on its run (``zbus-control --resume``) and the job goes on.

Two files in the run directory, each written atomically (temporary file and rename):

- ``control-state.json``: what the job's course rests on. The phase, epoch, round and the
  other counters, the commands that stand (re-published every heartbeat: the epoch under way,
  the round in flight, the slices, the settings, ...) and the nodes with their process ids.
  It is written before every standing command is published (write-ahead: a restarted control
  never re-issues a round or an epoch under a number already used for another) and once per
  heartbeat interval.
- ``control-history.json``: what the summary reports (epochs, backups, rounds, recoveries,
  membership events), written once per heartbeat interval; a crash loses at most that
  interval of it.

No fsync: the files survive the process being killed, which is what they are for.

A resumed control knows the nodes but they do not know it: each node's next message is
answered with Rejoin, and the node says Hello again (with its run id) and sends once more its
latest reports, which the dead control may never have read (``zbus.node``). Nodes that do not
come back within ``node_timeout_s`` are declared failed as usual. What was timed from the dead
process's clock (a shard, feeder or aggregator waiting to restart) is timed again from the
resume. An export under way is started again; a key migration under way
(``[placement] mode = "skew"``) cannot be resumed, and the job fails saying so.
"""

from __future__ import annotations

import base64
import logging
import time
from pathlib import Path

import orjson

from roles.algorithms.membership import ALIVE, NodeState
from roles.job.rundir import atomic_write
from zbus.codec import Message, decode

log = logging.getLogger(__name__)
STATE_FILE = "control-state.json"
HISTORY_FILE = "control-history.json"
STATE_VERSION = 1
SCALARS = ("phase", "epoch", "round", "round_in_flight", "epoch_end_round", "drained",
           "rounds_done", "paused", "settings", "settings_version", "generation",
           "shard_generation", "feeder_generation", "export_request", "backup_request",
           "finish_status")
HISTORY = ("data", "epochs", "round_samples", "settings_changes", "decisions", "backups",
           "recoveries", "shard_recoveries", "exports", "feeders_lost", "rows_counted",
           "feeder_recoveries", "model_plan", "migrations")


class ResumeError(Exception):
    """The run cannot be resumed (said in one line)."""


def encode_message(msg: Message) -> list[str]:
    return [base64.b64encode(bytes(f)).decode() for f in msg.to_frames()]


def decode_message(frames: list[str]) -> Message:
    return decode([base64.b64decode(f) for f in frames]).msg


def resumable_run(job_name: str, given: str, environ: dict) -> Path:
    """The run directory to resume: ``given``, else ZBUS_RUN_DIR, else the newest run of the
    job under runs/ with a control state."""
    if given and given != "latest":
        return Path(given).absolute()
    if environ.get("ZBUS_RUN_DIR"):
        return Path(environ["ZBUS_RUN_DIR"]).absolute()
    runs = sorted(Path("runs").glob(f"{job_name}-*/{STATE_FILE}"),
                  key=lambda p: p.stat().st_mtime)
    if not runs:
        raise ResumeError(f"no run of job {job_name} under runs/ to resume")
    return runs[-1].parent.absolute()


class StateKeeping:
    def init_state(self) -> None:
        self.next_save = 0.0
        self.started_at = time.time()  # the run's start, for its wall time across a resume
        self.run_before_s = 0.0        # resumed: how long the run had been going
        self.awaiting_rejoin: set[str] = set()  # resumed: nodes that have not said Hello

    # -- writing -----------------------------------------------------------------------------
    def save_state(self) -> None:
        m = self.members
        state = {"version": STATE_VERSION, "run_id": self.run_id, "started_at": self.started_at,
                 "fingerprint": self.job.fingerprint(),
                 **{k: getattr(self, k) for k in SCALARS},
                 "aggregator_lost": self.aggregator_lost_at is not None,
                 "shards_lost": sorted(self.shards_lost),
                 "shards_back": {n: u for n, (_, u) in self.shards_back.items()},
                 "feeders_down": sorted(self.feeders_down),
                 "members_version": m.version,
                 "nodes": {n: [s.role, s.index, s.host, s.pid, s.status, s.ready]
                           for n, s in m.nodes.items()},
                 "standing": {k: encode_message(v) for k, v in self.standing.items()}}
        atomic_write(self.run_dir / STATE_FILE, orjson.dumps(state), durable=False)

    def save_history(self) -> None:
        history = {k: getattr(self, k) for k in HISTORY}
        history["membership_events"] = self.members.events
        atomic_write(self.run_dir / HISTORY_FILE,
                     orjson.dumps(history, option=orjson.OPT_SERIALIZE_NUMPY), durable=False)

    def save_now(self, now: float) -> None:
        """Once per heartbeat interval (called from the clock)."""
        if now >= self.next_save and self.phase != "done":
            self.next_save = now + self.heartbeat_s
            self.save_state()
            self.save_history()

    # -- reading -----------------------------------------------------------------------------
    def resume_from_disk(self) -> None:
        try:
            state = orjson.loads((self.run_dir / STATE_FILE).read_bytes())
            history = orjson.loads((self.run_dir / HISTORY_FILE).read_bytes())
        except FileNotFoundError as exc:
            raise ResumeError(f"{self.run_dir} has no control state to resume "
                              f"({Path(exc.filename).name} missing)") from None
        except orjson.JSONDecodeError as exc:
            raise ResumeError(f"the control state in {self.run_dir} is unreadable: {exc}") \
                from None
        if state.get("version") != STATE_VERSION:
            raise ResumeError(f"control state version {state.get('version')!r}, this control "
                              f"reads {STATE_VERSION}")
        if state["fingerprint"] != self.job.fingerprint():
            raise ResumeError(f"run {state['run_id']} ran another job (fingerprint "
                              f"{state['fingerprint']}, this job has {self.job.fingerprint()})"
                              ": resume it with the same job file and ZBUS_* settings")
        if state["phase"] == "done":
            raise ResumeError(f"run {state['run_id']} has ended; there is nothing to resume")
        now = time.monotonic()
        self.started_at = state["started_at"]
        self.run_before_s = max(0.0, time.time() - self.started_at)
        for k in SCALARS:
            setattr(self, k, state[k])
        self.finish_status = tuple(self.finish_status)
        for k in HISTORY:
            setattr(self, k, history[k])
        self.aggregator_lost_at = now if state["aggregator_lost"] else None
        self.shards_lost = dict.fromkeys(state["shards_lost"], now)
        self.shards_back = {n: (now, u) for n, u in state["shards_back"].items()}
        self.feeders_down = dict.fromkeys(state["feeders_down"], now)
        m = self.members
        m.version, m.events = state["members_version"], history["membership_events"]
        for node_id, (role, index, host, pid, status, ready) in state["nodes"].items():
            m.nodes[node_id] = NodeState(role, index, host, pid, now, status=status,
                                         ready=ready)
        self.standing = {k: decode_message(v) for k, v in state["standing"].items()}
        self.slice_map = self.standing.get("slices")
        placement = self.standing.get("placement")
        if placement is not None and placement.phase != "active":
            raise ResumeError(f"a key migration (placement {placement.version}) was under way;"
                              " it cannot be resumed")
        if placement is not None:
            self.keymap = self.keymap.from_message(placement, self.job.cluster.shards,
                                                   self.job.placement.buckets_per_shard)
        self.awaiting_rejoin = {n for n, s in m.nodes.items() if s.status == ALIVE}
        self.last_progress = now
        self.metrics.write("resume", phase=self.phase, epoch=self.epoch, round=self.round,
                           nodes=sorted(n for n, s in m.nodes.items() if s.ready))
        log.warning("resumed run %s: phase %s, epoch %d, round %d; waiting for the nodes to "
                    "join again", self.run_id, self.phase, self.epoch + 1, self.round)
        self.standing.pop("export", None)
        if self.phase == "exporting":
            self.start_export(final=True)  # an export under way is made again
        elif self.phase == "finishing":
            self.finish(self.finish_status)
