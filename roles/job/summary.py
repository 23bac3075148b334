"""The run's summary (``summary.json``), laid out once: control builds a ``Summary`` when the job
ends (``roles.control.summary``, its figures from ``roles.algorithms.control.summary``), one
part per concern; the headline, tests and tools read one back with ``read_summary``, which
checks every key and type (msgspec), so that a key that vanished or changed fails there, loudly,
and not as a ``None`` further on. docs/operations.md ("Run files") says what each key means.

A figure that is not known (no epoch evaluated, no heartbeat) is None. Times are seconds,
sizes bytes. A record kept as the component wrote it (an epoch's, a recovery's, a checkpoint's)
is a ``dict``: its layout is the component's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

import msgspec

SUMMARY_FILE = "summary.json"


class SummaryError(ValueError):
    """A file that is not a summary of this zbus (said in one line)."""


class Outcome(TypedDict):
    """How the run ended: ``status`` completed, failed, interrupted (by a signal) or stopped
    (``zbus-ctl stop``), why (``reason``), and ``resume_from``: the checkpoint a resume goes
    back to (None: the run has ended for good)."""

    job: str
    run_id: str
    run_dir: str
    ok: bool
    status: str
    reason: str
    resume_from: int | None


class TaskFigures(TypedDict):
    """One task's figures over the eval rows that have its label
    (``roles.algorithms.shared.metrics``)."""

    auc: float | None           # None (NaN) when the rows hold one class only
    logloss: float | None
    ne: float | None            # the log loss over the entropy of the rows' base rate
    calibration: float | None   # mean predicted / observed positive rate
    gauc: float | None          # the group AUC ([metrics] group_by; None without)
    gauc_groups: int | None     # the groups it averages (with both classes)
    oracle_auc: float | None    # synthetic data: the true probabilities' AUC


class Results(TypedDict):
    """The model's quality: the last evaluated epoch's, and every epoch's (``per_epoch``)."""

    auc: float | None      # the first task's ([data] labels), as ``tasks`` has it
    logloss: float | None
    tasks: dict[str, TaskFigures]   # by label; empty before the first evaluation
    gauc_share: float | None    # the share of the groups the GAUCs are over (1: all)
    oracle_auc: float | None    # synthetic data: the best AUC any model reaches
    epochs: int                 # evaluated
    epochs_planned: int
    per_epoch: list[dict[str, Any]]   # train loss, samples, seconds, rows, auc, logloss


class DataRows(TypedDict):
    """The data as the feeders read it (None before its first pass has been counted)."""

    samples_in_data: int | None   # training samples per epoch
    eval_samples: int | None
    rows_read: int | None
    rejected_rows: int | None
    dropped_rows: int | None
    merged_rows: int | None


class Throughput(TypedDict):
    samples_trained: int             # acknowledged, all epochs
    wall_s: float                    # the whole run, across its resumes
    train_s: float                   # training passes only
    samples_per_s: float | None      # samples_trained / train_s
    workers: dict[str, int]          # samples acknowledged per worker
    samples_trained_by_workers: int  # the workers' own count


class FeederFigures(TypedDict):
    samples_acked: int
    batches_sent: int
    bytes_read: int
    parts_begun_ahead: int
    parts_held: int
    held_mb: float
    parts_read_from_memory: int


class PartsFigures(TypedDict):
    """The data's parts: how many, each one's feeder, and what happened to the feeders."""

    version: int
    parts: int
    per_feeder: list[int]
    owners: list[int]
    feeders_lost: list[dict[str, Any]]
    feeder_recoveries: list[dict[str, Any]]
    rows_per_epoch: list[dict[str, Any]]   # rows trained once, repeated, missed


class Feeding(TypedDict):
    feeders: dict[str, FeederFigures]
    parts: PartsFigures | None             # None: the data was never indexed
    fields: list[dict[str, Any]]           # per sparse field (``field_figures``)


class WorkerEmbeddingWaits(TypedDict):
    batches: int
    messages: int
    median_ms: float
    p90_ms: float


class EmbeddingWaits(TypedDict):
    mode: str                              # [train] embeddings
    median_ms: float | None
    p90_ms: float | None
    messages_per_batch: float | None
    workers: dict[str, WorkerEmbeddingWaits]


class WorkerWaits(TypedDict):
    """What the workers waited for between batches: seconds by reason per worker, and all
    workers' milliseconds per batch they ran."""

    batches: int
    workers: dict[str, dict[str, float]]
    ms_per_batch: dict[str, float]


class Workers(TypedDict):
    embeddings: EmbeddingWaits
    worker_input_bytes_per_sample: dict[str, dict[str, float]]   # per worker and channel
    data_path_messages: dict[str, dict[str, float]]   # per feeder, shard, worker
    take_windows: dict[str, dict[str, Any]]   # per worker, its last heartbeat's figures
    batch_by_label: bool
    worker_time_s: dict[str, dict[str, float]]
    worker_devices: dict[str, str | None]
    worker_waits: WorkerWaits


class Load(TypedDict):
    busy: dict[str, float]             # per node: the fraction of its life not waiting
    longest_turn_s: dict[str, float]   # per node: its event loop's longest turn


class Aggregation(TypedDict):
    sync: str
    rounds: int
    round_samples: dict[str, list[int]]   # per worker, per round (the newest)
    aggregation_decisions: dict[str, int]  # lazy: how often it aggregated, waited
    last_decision: str | None


class Duplicates(TypedDict):
    embedding_updates: int
    acks: int
    batch_copies: int


class ExactlyOnce(TypedDict):
    requeued_batches: int       # sent again after a worker was lost
    straggler_copies: int       # second copies at the ends of passes
    duplicates_refused: Duplicates


class StreamFigures(TypedDict):
    """A stream job's (docs/streams.md): events read (taken by the feeders), trained, trained
    twice (the events of batches acknowledged twice: 0; None, not counted, once a feeder was
    restarted mid-stream: repeated batch ids do not show across processes), set aside; the
    broker's
    lag at the end (messages of the group not acknowledged, and in events at the mean events a
    message) and the seconds from the newest event trained to the job's end; progressive
    validation (each event scored by the model before it trained on it): the lifetime AUC and
    log loss over every feeder's events, and each feeder's closed windows; the label join's
    counts, added up over the feeders."""

    events_read: int
    events_trained: int
    events_trained_twice: int | None
    events_rejected: int
    messages_acked: int
    lag_events: int | None
    lag_messages: int | None
    lag_s: float | None
    progressive_auc: float | None
    progressive_logloss: float | None
    windows: list[dict[str, Any]]
    ended_by: str
    # several labels ([data] labels): each one's lifetime auc, logloss, ne and calibration over
    # the events that have it (None: one label, whose figures are progressive_auc/_logloss)
    tasks: dict[str, dict[str, float | None]] | None
    # several labels: each one's closed windows (as ``windows``, over the events that have it)
    task_windows: dict[str, list[dict[str, Any]]] | None
    join: dict[str, int] | None   # labels from a topic of their own (docs/streams.md): joined,
                                  # expired_negative, labels_late, labels_unmatched, ...; None:
                                  # the labels came with the events


class Streaming(TypedDict):
    stream: StreamFigures | None     # None: the job read files


class Nodes(TypedDict):
    membership: list[dict[str, Any]]   # every worker joined, left, failed
    counters_not_final: list[str]      # figures of their last heartbeat, not their final
    stalls: list[dict[str, Any]]       # silences control could not have heard (the newest)
    stalls_total: int


class Settings(TypedDict):
    settings: dict[str, Any]           # the effective live settings
    settings_changes: list[dict[str, Any]]


class CheckpointFigures(TypedDict):
    """Whole-job checkpoints (``roles.control.checkpoints``)."""

    every_s: float
    complete: int
    aborted: int
    bytes: int
    max_pause_s: float
    max_shard_pause_s: float
    latest: int | None
    latest_dir: str | None
    rollbacks: list[dict[str, Any]]    # checkpoint, round, epoch, at_s, retrained_samples
    retrained_samples: int
    records: list[dict[str, Any]]      # the newest cuts


class Recoveries(TypedDict):
    backups: int
    latest_backup: str | None
    recoveries: int                    # every recovery: the sum of ``recovered``
    recovered: dict[str, int]          # by kind (roles.control.recovery.recovery_counts)
    recovery: list[dict[str, Any]]     # each aggregator restore
    shard_recoveries: list[dict[str, Any]]
    checkpoints: CheckpointFigures


class Exports(TypedDict):
    export: str | None                 # the final export's directory
    exports: list[dict[str, Any]]


class Traffic(TypedDict):
    bytes: dict[str, int]              # sent, per channel
    bytes_received: dict[str, int]     # received, per channel
    rejected_messages: dict[str, dict[str, int]]   # per node and kind


class TableFigures(TypedDict):
    """What kept the shards' tables bounded: the settings, per shard and in total."""

    min_count: int
    expire_batches: int
    expire_s: float
    max_rows_per_shard: int
    sketch_mb: float
    total: dict[str, int]
    shards: dict[str, dict[str, int]]


class Shards(TypedDict):
    shards: dict[str, dict[str, Any]]  # per shard: its last counters
    tables: TableFigures
    placement: dict[str, Any]          # mode; with skew, the placement keeper's figures
    model_parallel: dict[str, Any] | None   # parts > 1: the plan's figures and members


class Summary(Outcome, Results, DataRows, Throughput, Feeding, Workers, Load, Aggregation,
              ExactlyOnce, Nodes, Settings, Recoveries, Exports, Traffic, Shards, Streaming):
    """summary.json: every part above."""


_decoder = msgspec.json.Decoder(Summary)


def decode_summary(data: bytes, where: str = SUMMARY_FILE) -> Summary:
    """A summary from its JSON, every key and type checked; SummaryError when it is not one
    (``where`` names it)."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:  # ValidationError too
        raise SummaryError(f"{where} is not a summary of this zbus: {exc}") from None


def read_summary(path: Path | str) -> Summary:
    """The summary in file ``path`` (a run directory: its ``summary.json``), checked
    (``decode_summary``); FileNotFoundError when there is none."""
    path = Path(path)
    if path.is_dir():
        path = path / SUMMARY_FILE
    return decode_summary(path.read_bytes(), str(path))
