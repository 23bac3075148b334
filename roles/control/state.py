"""Control's state on disk, so that a control killed mid-job can be started again on its run
(``zbus-control --resume``) and the job goes on.

Two typed records, each written atomically (temporary file and rename) into the run directory:

- ``control-state.json`` (``ControlState``): what the job's course rests on, one entry
  per component of control (the course's phase and epoch, the rounds, the feeders and shards waited
  for, the live settings, ...), the nodes with their process ids, and the commands that stand
  (as wire frames). It is written before every standing command is published (write-ahead: a
  restarted control never calls a round or starts an epoch under a number already used) and
  once per heartbeat interval.
- ``control-history.json`` (``ControlHistory``): what the summary reports (epochs, backups,
  rounds, recoveries, membership events, ...), written once per heartbeat interval; a crash
  loses at most that interval of it.

No fsync: the files survive the process being killed, which is what they are for.

A resumed control knows the nodes but they do not know it: each node's next message is
answered with Rejoin, and the node says Hello again (with its run id) and sends once more its
latest reports, which the dead control may never have read (``zbus.node``). Nodes that do not
come back within ``node_timeout_s`` are declared failed as usual. What was timed from the dead
process's clock (a shard, feeder or aggregator waiting to restart) is timed again from the
resume. An export under way is started again; a key migration under way
(``[placement] mode = "skew"``) is not: the whole job can go back to its newest checkpoint
(no cut is taken during a migration), but a control whose nodes lived on fails saying so.
"""

from __future__ import annotations

import base64
import dataclasses
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from roles.algorithms.control.membership import Members, NodeState
from roles.control.checkpoints import Checkpoints, CheckpointsState
from roles.control.commands import Commands
from roles.control.course import Course, CourseState
from roles.control.exports import Exports
from roles.control.feeding import Feeding, FeedingState
from roles.control.placement import PlacementKeeper
from roles.control.recovery import Recovery, RecoveryState
from roles.control.rounds import Rounds, RoundsState
from roles.control.settings import LiveSettings, SettingsState
from roles.job.settings import Job, job_to_toml
from roles.storage.fs import StorageError
from roles.storage.store import Store, basename
from zbus.codec import Message, decode
from zbus.files import atomic_write

STATE_FILE = "control-state.json"
HISTORY_FILE = "control-history.json"
STATE_VERSION = 3


class ResumeError(Exception):
    """The run cannot be resumed (said in one line)."""


@dataclass
class ControlState:
    run_id: str
    started_at: float                 # the run's start (wall clock), for its wall time
    fingerprint: str
    course: CourseState
    rounds: RoundsState
    feeding: FeedingState
    recovery: RecoveryState
    settings: SettingsState
    export_request: int
    members_version: int
    nodes: dict[str, list]            # node -> [role, index, host, pid, status, ready]
    standing: dict[str, list[str]]    # name -> the command's frames, base64
    checkpoints: CheckpointsState = field(default_factory=CheckpointsState)
    version: int = STATE_VERSION


@dataclass
class ControlHistory:
    data: dict = field(default_factory=dict)
    epochs: list[dict] = field(default_factory=list)
    round_samples: dict[str, list[int]] = field(default_factory=dict)
    settings_changes: list[dict] = field(default_factory=list)
    backups: list[dict] = field(default_factory=list)
    backups_written: int | None = None   # None: a state file from before the count
    recoveries: list[dict] = field(default_factory=list)
    shard_recoveries: list[dict] = field(default_factory=list)
    exports: list[dict] = field(default_factory=list)
    feeders_lost: list[dict] = field(default_factory=list)
    feeder_recoveries: list[dict] = field(default_factory=list)
    rows_counted: list[dict] = field(default_factory=list)
    migrations: list[dict] = field(default_factory=list)
    membership_events: list[dict] = field(default_factory=list)
    model_plan: dict | None = None
    checkpoints: list[dict] = field(default_factory=list)
    checkpoint_totals: dict = field(default_factory=dict)
    rollbacks: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class ControlComponents:
    """Control's components whose state the records hold (``Control.components``)."""

    members: Members
    commands: Commands
    course: Course
    rounds: Rounds
    feeding: Feeding
    recovery: Recovery
    exports: Exports
    settings: LiveSettings
    placement: PlacementKeeper
    checkpoints: Checkpoints


def capture_state(p: ControlComponents, run_id: str, started_at: float,
                  fingerprint: str) -> ControlState:
    m = p.members
    return ControlState(
        run_id=run_id, started_at=started_at, fingerprint=fingerprint,
        course=p.course.to_state(), rounds=p.rounds.to_state(), feeding=p.feeding.to_state(),
        recovery=p.recovery.to_state(), settings=p.settings.to_state(),
        export_request=p.exports.request, members_version=m.version,
        nodes={n: [s.role, s.index, s.host, s.pid, s.status, s.ready]
               for n, s in m.nodes.items()},
        standing={k: encode_message(v) for k, v in p.commands.standing.items()},
        checkpoints=p.checkpoints.to_state())


def capture_history(p: ControlComponents, model_plan: dict | None) -> ControlHistory:
    f, r = p.feeding, p.recovery
    return ControlHistory(
        data=f.data, epochs=p.course.epochs, round_samples=p.rounds.samples,
        settings_changes=p.settings.changes, backups=r.backups,
        backups_written=r.backups_written, recoveries=r.recoveries,
        shard_recoveries=r.shard_recoveries, exports=p.exports.exports, feeders_lost=f.lost,
        feeder_recoveries=f.recoveries, rows_counted=f.rows_counted,
        migrations=p.placement.migrations, membership_events=p.members.events,
        model_plan=model_plan, checkpoints=p.checkpoints.records,
        checkpoint_totals=p.checkpoints.totals, rollbacks=p.checkpoints.rollbacks)


def restore(p: ControlComponents, state: ControlState, h: ControlHistory, now: float) -> None:
    """Put the records back into the components (all but the course, which a resumed control
    restores last: it may start an export again)."""
    p.commands.standing = {k: decode_message(v) for k, v in state.standing.items()}
    m = p.members
    m.version, m.events = state.members_version, h.membership_events
    for node_id, (role, index, host, pid, status, ready) in state.nodes.items():
        m.nodes[node_id] = NodeState(role, index, host, pid, now, status=status, ready=ready)
    p.rounds.from_state(state.rounds, h.round_samples)
    f = p.feeding
    f.from_state(state.feeding, now)
    f.data, f.lost, f.recoveries, f.rows_counted = (h.data, h.feeders_lost,
                                                    h.feeder_recoveries, h.rows_counted)
    r = p.recovery
    r.from_state(state.recovery, now)
    r.backups, r.recoveries, r.shard_recoveries = h.backups, h.recoveries, h.shard_recoveries
    r.backups_written = len(h.backups) if h.backups_written is None else h.backups_written
    p.exports.from_state(state.export_request)
    p.exports.exports = h.exports
    p.settings.from_state(state.settings)
    p.settings.changes = h.settings_changes
    p.placement.from_state()
    p.placement.migrations = h.migrations
    p.course.epochs = h.epochs
    ck = p.checkpoints
    ck.records, ck.rollbacks = h.checkpoints, h.rollbacks
    ck.totals.update(h.checkpoint_totals)
    ck.from_state(state.checkpoints, now)


def encode_message(msg: Message) -> list[str]:
    return [base64.b64encode(bytes(f)).decode() for f in msg.to_frames()]


def decode_message(frames: list[str]) -> Message:
    return decode([base64.b64decode(f) for f in frames]).msg


def _build(cls: Any, value: Any) -> Any:
    """A dataclass (nested ones too) from what orjson read; TypeError/KeyError when it does
    not fit."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise KeyError(f.name)
            continue
        kind = hints[f.name]
        kwargs[f.name] = _build(kind, value[f.name]) if dataclasses.is_dataclass(kind) \
            else value[f.name]
    return cls(**kwargs)


def cut_files(p: ControlComponents, state: ControlState, history: ControlHistory,
              number: int) -> dict[str, bytes]:
    """Control's part of checkpoint ``number``: its records as they stand at the cut, as a
    control resumed on the checkpoint will read them (the cut complete, no cut standing)."""
    state.checkpoints = CheckpointsState(number, number)
    state.standing.pop("checkpoint", None)
    return {STATE_FILE: orjson.dumps(state),
            HISTORY_FILE: orjson.dumps(history, option=orjson.OPT_SERIALIZE_NUMPY)}


def write_records(run_dir: Path, state: ControlState, history: ControlHistory) -> None:
    """Control's records into its run directory, the history first: the state file is what
    says that a run directory holds records to resume (``roles.tools.pod.control_args``,
    ``Resumption.from_disk``), so it is written last, and a directory that has it has the
    history too. (A state written alone, by a control that failed before its first save of
    both, left a pod's control unable to start again: "control-history.json missing".)"""
    atomic_write(run_dir / HISTORY_FILE,
                 orjson.dumps(history, option=orjson.OPT_SERIALIZE_NUMPY), durable=False)
    atomic_write(run_dir / STATE_FILE, orjson.dumps(state), durable=False)


def read_state(run_dir: Path | str, job: Job) -> tuple[ControlState, ControlHistory]:
    """The records of a run (or of a checkpoint: a directory, or an object store's URI) to
    resume ``job`` from; ResumeError when it cannot be."""
    fingerprint = job.fingerprint()
    store = Store(str(run_dir))
    try:
        raw = orjson.loads(store.read_bytes(STATE_FILE))
        raw_history = orjson.loads(store.read_bytes(HISTORY_FILE))
    except FileNotFoundError as exc:
        raise ResumeError(f"{run_dir} has no control state to resume "
                          f"({basename(str(exc.filename or exc))} missing)") from None
    except StorageError as exc:
        raise ResumeError(f"the control state in {run_dir} cannot be read: {exc}") from None
    except orjson.JSONDecodeError as exc:
        raise ResumeError(f"the control state in {run_dir} is unreadable: {exc}") from None
    if not isinstance(raw, dict) or raw.get("version") != STATE_VERSION:
        raise ResumeError(f"control state version {raw.get('version')!r}, this control "
                          f"reads {STATE_VERSION}" if isinstance(raw, dict) else
                          f"the control state in {run_dir} is not an object")
    try:
        state = _build(ControlState, raw)
        history = _build(ControlHistory, raw_history)
    except (TypeError, KeyError) as exc:
        raise ResumeError(f"the control state in {run_dir} is incomplete: {exc}") from None
    if state.fingerprint != fingerprint:
        raise ResumeError(f"run {state.run_id} ran another job ({differences(run_dir, job)}): "
                          "resume it with the same job file and ZBUS_* settings")
    if state.course.phase == "done":
        raise ResumeError(f"run {state.run_id} has ended; there is nothing to resume"
                          f"{how_it_ended(run_dir)}")
    return state, history


JOB_RECORDS = ("config.toml", "job.toml")  # the effective job: in a run, in a checkpoint
DIFFERENCES_SAID = 4


def differences(run_dir: Path | str, job: Job) -> str:
    """Which settings of ``job`` differ from the job the run (or checkpoint) recorded, for a
    person."""
    store = Store(str(run_dir))
    recorded = next((name for name in JOB_RECORDS if store.size(name) is not None),
                    JOB_RECORDS[0])
    try:
        before = flat_settings(tomllib.loads(store.read_bytes(recorded).decode()))
    except (OSError, StorageError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return f"its fingerprint differs from this job's {job.fingerprint()}"
    now = flat_settings(tomllib.loads(job_to_toml(job)))
    changed = [f"{key} = {show(before.get(key))} in the run, {show(now.get(key))} now"
               for key in sorted(before.keys() | now.keys()) if before.get(key) != now.get(key)]
    if not changed:
        return (f"the same settings as {recorded}, but another fingerprint: a run of "
                "another version of zbus")
    more = len(changed) - DIFFERENCES_SAID
    return "; ".join(changed[:DIFFERENCES_SAID]) + (f"; and {more} more" if more > 0 else "")


def flat_settings(table: dict, section: str = "") -> dict[str, Any]:
    """``{"[train] epochs": 3, ...}`` from a job's TOML tables."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(flat_settings(value, f"{section}.{key}" if section else key))
        else:
            flat[f"[{section}] {key}" if section else key] = value
    return flat


def show(value: Any) -> str:
    return "(unset)" if value is None else orjson.dumps(value).decode()


def how_it_ended(run_dir: Path | str) -> str:
    """`` (failed: why)`` from the run's summary, or nothing; an interrupted run ended only
    because it had no complete checkpoint to go back to."""
    try:
        summary = orjson.loads(Store(str(run_dir)).read_bytes("summary.json"))
        said = f"{summary['status']}: {summary['reason']}" if summary.get("reason") \
            else summary["status"]
    except (OSError, StorageError, orjson.JSONDecodeError, KeyError, TypeError,
            AttributeError):
        return ""
    if summary["status"] == "interrupted":
        said += ", before its first complete checkpoint"
    return f" ({said})"


def ended_for_good(run_dir: Path) -> str | None:
    """How the run in ``run_dir`` ended for good (``completed``, ``failed: why``...), or None
    when it holds no control state or can still be resumed (a run that ended resumable keeps
    the state it resumes from, whose phase is not ``done``)."""
    try:
        raw = orjson.loads((run_dir / STATE_FILE).read_bytes())
        phase = raw["course"]["phase"]
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if phase != "done":
        return None
    return how_it_ended(run_dir)[2:-1] or "ended"


def resumable_run(job_name: str, given: str, environ: dict) -> Path:
    """The run directory to resume: ``given``, else ZBUS_RUN_DIR, else the newest run of the
    job under runs/ with a control state."""
    if given and given not in ("latest", "1"):
        return Path(given).absolute()
    if environ.get("ZBUS_RUN_DIR"):
        return Path(environ["ZBUS_RUN_DIR"]).absolute()
    runs = sorted(Path("runs").glob(f"{job_name}-*/{STATE_FILE}"),
                  key=lambda p: p.stat().st_mtime)
    if not runs:
        raise ResumeError(f"no run of job {job_name} under runs/ to resume")
    return runs[-1].parent.absolute()
