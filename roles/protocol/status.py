"""The status control publishes for consoles (``Status``'s body, channel "status"), laid out
once: control builds a ``StatusSnapshot`` (``roles.control.operators.StatusView``, with
``roles.algorithms.control.status.StatusBuilder``'s rates and rows), a console reads one
(``console/``), Prometheus is served from one (``roles.control.prometheus``). ``STATUS_LAYOUT``
is the layout's version: a console refuses a body of another (``"layout"``).

A field that may be unknown yet (no heartbeat, no rate between two, no epoch evaluated) is
None. Times are seconds, sizes bytes, rates per second.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

# 4: serving; 3: stream; 2: tasks, waiting, final, checkpoint
STATUS_LAYOUT = 4


class TaskFigures(TypedDict):
    """A long task's progress (``roles.algorithms.shared.progress.Progress.figures``)."""

    task: str
    unit: str
    done: float
    total: float | None
    rate: float | None
    eta_s: float | None
    elapsed_s: float


class Task(TaskFigures):
    """A long task under way, and the node doing it ("control" for an export's or a
    checkpoint's)."""

    node: str


class NodeRow(TypedDict):
    """One node as control sees it. ``state``: its health (alive, suspect, failed, left);
    ``doing``: what the node says it does (loading, training, paused, ...); ``backlog``: its
    queue (a feeder's batches in flight, a worker's pipeline, a shard's held batches and
    waiting look-ups)."""

    id: str
    role: str
    index: int
    host: str
    pid: int
    state: str
    doing: str
    cpu: float | None
    rss: float | None
    in_per_s: float | None
    out_per_s: float | None
    bytes_in: float | None
    bytes_out: float | None
    samples_per_s: float | None
    backlog: int | None
    round_samples: float | None
    beat_age_s: float
    progress: TaskFigures | None


class DecisionView(TypedDict):
    """Sync mode lazy's latest aggregation decision, and how old it is."""

    round: int
    aggregate: bool
    reason: str
    age_s: float


class ClusterView(TypedDict):
    net_util: float
    net_util_max: float
    failure_rate: float
    failure_rate_max: float
    live_workers: int
    decision: DecisionView | None
    decisions: dict[str, int]          # "aggregate", "wait": counts
    rounds_done: int
    backups: int
    latest_backup: dict[str, Any] | None   # round, path, change, generation
    recoveries: int                    # every recovery so far: the sum of ``recovered``
    # by kind: aggregator (restored from a backup), shard (restarted from the checkpoint),
    # feeder (the last one restarted from its ack log), feeder_handover (a lost feeder's parts
    # handed to another), rollback (the whole job resumed from a checkpoint)
    recovered: dict[str, int]


class History(TypedDict):
    """The recent training loss and throughput, one point per heartbeat or second."""

    t: list[float]
    loss: list[float | None]
    samples_per_s: list[float]


class EpochFigures(TypedDict):
    """An epoch trained (from 0), and its figures once known."""

    epoch: int
    train_loss: float | None
    auc: float | None
    logloss: float | None
    tasks: dict[str, dict[str, float | None]]   # each label's figures (summary's ``tasks``)


class TrainingView(TypedDict):
    samples_acked: int
    epoch_samples: int
    samples_per_epoch: int
    samples_per_s: float
    eta_epoch_s: float | None
    eta_job_s: float | None
    history: History
    epochs: list[EpochFigures]     # the newest 100 (the summary has every epoch)


class SettingsView(TypedDict):
    """The live settings: their version, values, and each one's type and range."""

    version: int
    values: dict[str, Any]
    ranges: dict[str, dict[str, Any]]


class ShardRow(TypedDict):
    """A shard: keys held, keys served per second and its share, what keeps its table bounded
    (None when it does not say); with skew-aware placement also its predicted capacity and
    assigned pairs of the last window, its overflowing heavy keys, the keys moved in and its
    slowdown knob."""

    shard: int
    keys: int
    keys_per_s: float
    share: float | None
    admitted: int | None
    rejected: int | None
    expired: int | None
    evicted: int | None
    capacity: NotRequired[float | None]
    assigned: NotRequired[int | None]
    overflow: NotRequired[int | None]
    moved: NotRequired[int]
    slowdown: NotRequired[float | None]


class EmbeddingsView(TypedDict):
    placement: str                          # "hash" or "skew"
    shards: list[ShardRow]
    imbalance: float | None                 # busiest shard's keys per second over the mean
    skew_aware: dict[str, Any] | None       # roles.control.placement: PlacementKeeper.status
    bounds: dict[str, Any] | None           # the job's [embeddings]
    fields: NotRequired[list[dict[str, Any]]]   # per sparse field (summary's field_figures)


class PartitionView(TypedDict):
    embeddings: EmbeddingsView
    model: dict[str, Any] | None            # the model-parallel plan's figures, if any


class LatestCheckpoint(TypedDict):
    """The newest complete checkpoint (its pauses not known after a resume)."""

    number: int
    bytes: int
    pause_s: float | None
    shard_pause_s: float | None
    dir: str
    age_s: float | None


class CutUnderWay(TypedDict):
    number: int
    phase: str
    elapsed_s: float


class AbortedCut(TypedDict):
    number: int
    why: str


class CheckpointView(TypedDict):
    """Whole-job checkpoints (``roles.control.checkpoints``)."""

    every_s: float
    complete: int
    aborted: int
    latest: LatestCheckpoint | None
    under_way: CutUnderWay | None
    last_aborted: AbortedCut | None
    next_in_s: float | None
    rollbacks: list[dict[str, Any]]         # checkpoint, round, epoch, at_s, retrained_samples


class StreamRow(TypedDict):
    """A stream job's feeder (docs/streams.md, "Figures"), from its last heartbeat."""

    node: str
    events_read: int
    events_trained: int
    events_rejected: int
    lag_events: int | None
    lag_s: float | None
    progressive_auc: float | None
    window_auc: float | None
    broker_down_since: float | None
    # acknowledgements the broker did not take (EventReader.acks_refused): messages trained
    # that come again
    acks_refused: int
    join: dict[str, int] | None   # labels from a topic of their own (roles.feeder.joining)
    # several labels: each one's progressive_auc and window_auc, by label (None: one label)
    tasks: dict[str, dict[str, float | None]] | None


class StreamView(TypedDict):
    """A stream job's figures: each feeder's, the job's totals, and the recent lag (one point
    per status, the newest ``HISTORY_POINTS``; ``growing``: the lag rose over the last few)."""

    feeders: list[StreamRow]
    events_trained: int
    lag_events: int | None
    lag_s: float | None
    growing: bool
    tasks: dict[str, dict[str, float | None]] | None   # several labels: each one's lowest
    #                                                    progressive_auc and window_auc
    task_history: dict[str, list[float | None]] | None   # and each one's lowest window_auc
    #                                                      at each point of history["t"]
    task_progressive_history: dict[str, list[float | None]] | None   # its progressive_auc
    history: dict[str, list[float | None]]   # t, lag_events, lag_s, events_per_s,
    #                                          window_auc, progressive_auc (lowest feeder's)


SERVER_GONE_S = 10.0   # a serving process not heard from this long is listed as gone


class ServerRow(TypedDict):
    """A serving process that follows the job (``zbus-serve --follow``), from its last
    ``ServerReport`` (``age_s`` ago; gone after ``SERVER_GONE_S``)."""

    server: str
    url: str
    version: str
    ready: bool
    version_lag_s: float | None
    requests_per_s: float
    rows_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    age_s: float


class Wait(TypedDict):
    """A node the job waits for (to join, to be restarted), the command that starts it ("" when
    it is not to be started by hand, or not yet: it runs, or a supervisor is starting it), how
    long the job has waited and may still."""

    node: str
    what: str
    restart: str
    waited_s: float
    left_s: float


class Final(TypedDict):
    """How the job ended (control publishes it a few more times before it exits)."""

    status: str | None
    reason: str
    auc: float | None
    logloss: float | None
    summary: str
    wall_s: float | None
    samples_per_s: float | None
    # the checkpoint a resume goes back to (the end is resumable: a supervisor that starts
    # control again, zbus-pod on Kubernetes, goes on with the run), else None
    resume_from: NotRequired[int | None]


class StatusSnapshot(TypedDict):
    layout: int
    job: str
    run_id: str
    run_dir: str
    phase: str
    sync: str
    paused: bool
    uptime_s: float
    status_s: float
    heartbeat_s: float
    epoch: int
    epochs: int
    round: int
    round_in_flight: bool
    nodes: list[NodeRow]
    cluster: ClusterView
    training: TrainingView
    settings: SettingsView
    partition: PartitionView
    tasks: list[Task]
    checkpoint: CheckpointView
    waiting: list[Wait]
    final: Final | None
    stream: StreamView | None
    serving: list[ServerRow]
