"""The cluster's figures for Prometheus: a collector that reads control's latest status
snapshot (``roles.protocol.status``) when Prometheus scrapes ``/metrics``, served by the
``prometheus_client`` library's HTTP server on its own thread (control's loop only swaps the
snapshot in). Every figure is named ``zbus_*``; the list is in docs/operations.md
(monitoring), and ``docs/grafana-dashboard.json`` charts them.

Per node (labels ``node``, ``role``): up, suspect, CPU, resident memory, bus bytes in and out
(cumulative and per second), samples per second, queue, heartbeat age, the progress of a long
task. Per job (label ``job``): information (run, sync mode, phase), epoch, loss, AUC, log loss,
samples trained and per second, the ETA, rounds, aggregation decisions, backups, recoveries,
whole-job checkpoints (the newest: number, age, bytes, pause), network utilisation and failure
rate against their thresholds, live workers, what the job waits for, the embedding shards
(keys, keys per second, share of the load) and the placement (key map version, migrations, keys
moved, imbalance), and how the job ended.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from roles.protocol.status import EmbeddingsView, NodeRow, StatusSnapshot, StreamView

PHASES = ("starting", "preparing", "training", "syncing", "evaluating", "exporting",
          "finishing", "done")


TASK_FIGURES = {"auc": "AUC", "logloss": "log loss", "ne": "normalized entropy",
                "calibration": "calibration (mean predicted / observed rate)",
                "gauc": "group AUC ([metrics] group_by)"}


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, (int, float)) else None


class Families:
    """Metric families under construction, each made on first use."""

    def __init__(self) -> None:
        self.made: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}

    def add(self, name: str, doc: str, labels: dict[str, str], value: Any,
            counter: bool = False) -> None:
        v = _num(value)
        if v is None:
            return
        family = self.made.get(name)
        if family is None:
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            family = self.made[name] = kind(name, doc, labels=list(labels))
        family.add_metric(list(labels.values()), v)


class StatusCollector(Collector):
    """The figures of the latest snapshot; none before control published one."""

    def __init__(self) -> None:
        self.latest: StatusSnapshot | None = None  # replaced whole by control's loop

    def collect(self) -> Iterator[Metric]:
        snap = self.latest
        if snap is None:
            return iter(())
        return iter(families(snap).made.values())


def families(snap: StatusSnapshot) -> Families:
    f = Families()
    job = {"job": str(snap.get("job", ""))}
    _job(f, job, snap)
    for n in snap.get("nodes", []):
        _node(f, {"node": str(n["id"]), "role": str(n["role"])}, n)
    _partition(f, job, snap.get("partition", {}).get("embeddings", {}))
    for t in snap.get("tasks", []):
        labels = {"node": str(t.get("node")), "task": str(t.get("task"))}
        total = _num(t.get("total"))
        if total:
            f.add("zbus_task_progress_ratio", "How far a long task (indexing, the statistics "
                  "pass, an export) has got, 0 to 1", labels, (_num(t.get("done")) or 0) / total)
        f.add("zbus_task_eta_seconds", "Seconds a long task still needs, at its rate so far",
              labels, t.get("eta_s"))
    stream = snap.get("stream")
    if stream:
        _stream(f, job, stream)
    for w in snap.get("waiting", []):
        f.add("zbus_waiting_seconds_left", "The job waits for this node (to join, or to be "
              "restarted): seconds before it gives up", {"node": str(w["node"])}, w["left_s"])
    return f


def _job(f: Families, job: dict[str, str], snap: StatusSnapshot) -> None:
    f.add("zbus_job_info", "The job: its run, sync mode and phase", {
        **job, "run_id": str(snap.get("run_id", "")), "sync": str(snap.get("sync", "")),
        "phase": str(snap.get("phase", ""))}, 1)
    for phase in PHASES:
        f.add("zbus_job_phase", "1 for the job's current phase", {**job, "phase": phase},
              1 if snap.get("phase") == phase else 0)
    f.add("zbus_job_paused", "1 while an operator has paused feeding", job, snap.get("paused"))
    f.add("zbus_epoch", "The epoch under way, from 1 (0: not started)", job,
          (snap.get("epoch", -1) or 0) + 1)
    f.add("zbus_epochs", "Epochs the job trains", job, snap.get("epochs"))
    f.add("zbus_round", "The aggregation round", job, snap.get("round"))
    t = snap.get("training", {})
    losses = [x for x in t.get("history", {}).get("loss", []) if x is not None]
    f.add("zbus_train_loss", "Training loss of the samples acknowledged in the last interval",
          job, losses[-1] if losses else None)
    done = [e for e in t.get("epochs", []) if e.get("auc") is not None]
    if done:
        f.add("zbus_eval_auc", "Eval AUC of the last evaluated epoch", job, done[-1]["auc"])
        f.add("zbus_eval_logloss", "Eval log loss of the last evaluated epoch", job,
              done[-1]["logloss"])
        for task, figures in done[-1].get("tasks", {}).items():
            for figure, number in figures.items():
                f.add(f"zbus_eval_task_{figure}", f"Eval {TASK_FIGURES.get(figure, figure)} of "
                      "each label ([data] labels), the last evaluated epoch",
                      {**job, "task": task}, number)
    f.add("zbus_samples_trained", "Training samples acknowledged, all epochs", job,
          t.get("samples_acked"), counter=True)
    f.add("zbus_samples_per_second", "Training samples acknowledged per second", job,
          t.get("samples_per_s"))
    per_epoch = _num(t.get("samples_per_epoch"))
    if per_epoch:
        f.add("zbus_epoch_progress_ratio", "How far the epoch has got, 0 to 1", job,
              min(1.0, (_num(t.get("epoch_samples")) or 0) / per_epoch))
    f.add("zbus_eta_epoch_seconds", "Seconds left in the epoch at the current rate", job,
          t.get("eta_epoch_s"))
    f.add("zbus_eta_job_seconds", "Seconds left in the job at the current rate", job,
          t.get("eta_job_s"))
    c = snap.get("cluster", {})
    f.add("zbus_rounds", "Aggregation rounds done", job, c.get("rounds_done"), counter=True)
    for verdict, count in c.get("decisions", {}).items():
        f.add("zbus_decisions", "Sync mode lazy's aggregation decisions, by verdict",
              {**job, "decision": str(verdict)}, count, counter=True)
    k = snap.get("checkpoint") or {}
    latest: Mapping[str, object] = k.get("latest") or {}
    for name, doc, value, counter in (
            ("zbus_backups", "Backups of the dense weights written", c.get("backups"), True),
            ("zbus_recoveries", "Recoveries: the aggregator restored, a shard or the last "
             "feeder restarted, a lost feeder's parts handed over, the job resumed",
             c.get("recoveries"), True),
            ("zbus_network_utilisation", "The cluster's network utilisation (0 to 1)",
             c.get("net_util"), False),
            ("zbus_network_utilisation_max", "Live setting net_util_max",
             c.get("net_util_max"), False),
            ("zbus_failure_rate", "Nodes with a late probe per live node",
             c.get("failure_rate"), False),
            ("zbus_failure_rate_max", "Live setting failure_rate_max",
             c.get("failure_rate_max"), False),
            ("zbus_live_workers", "Workers alive", c.get("live_workers"), False),
            ("zbus_checkpoints", "Whole-job checkpoints complete", k.get("complete"), True),
            ("zbus_checkpoints_aborted", "Whole-job checkpoints abandoned", k.get("aborted"),
             True),
            ("zbus_checkpoint_in_progress", "1 while a checkpoint is being cut",
             k.get("under_way") is not None if k else None, False),
            ("zbus_checkpoint_latest", "The newest complete checkpoint's number",
             latest.get("number"), False),
            ("zbus_checkpoint_age_seconds", "Seconds since the newest complete checkpoint",
             latest.get("age_s"), False),
            ("zbus_checkpoint_bytes", "Bytes the newest complete checkpoint wrote",
             latest.get("bytes"), False),
            ("zbus_checkpoint_pause_seconds", "How long the newest checkpoint paused training",
             latest.get("pause_s"), False)):
        f.add(name, doc, job, value, counter=counter)
    final = snap.get("final")
    if final:
        f.add("zbus_job_ended", "1 once the job has ended, by how", {
            **job, "status": str(final.get("status"))}, 1)


def _stream(f: Families, job: dict[str, str], s: StreamView) -> None:
    f.add("zbus_stream_lag_events", "A stream job: events the broker holds for the job and "
          "that are not acknowledged", job, s["lag_events"])
    f.add("zbus_stream_lag_seconds", "A stream job: seconds from the newest event trained to "
          "now (0 when nothing waits)", job, s["lag_s"])
    f.add("zbus_stream_lag_growing", "1 while the stream's lag rises status after status",
          job, s["growing"])
    for r in s["feeders"]:
        labels = {**job, "node": r["node"]}
        f.add("zbus_stream_events_trained", "Events of the stream trained", labels,
              r["events_trained"], counter=True)
        f.add("zbus_stream_events_read", "Events of the stream read", labels,
              r["events_read"], counter=True)
        f.add("zbus_stream_events_rejected", "Events of the stream set aside (malformed)",
              labels, r["events_rejected"], counter=True)
        f.add("zbus_stream_feeder_lag_events", "A feeder's share of the lag, in events", labels,
              r["lag_events"])
        f.add("zbus_stream_progressive_auc", "Progressive validation: the AUC of every event "
              "scored before it was trained, over the feeder's events", labels,
              r["progressive_auc"])
        f.add("zbus_stream_window_auc", "Progressive validation: the AUC of the newest closed "
              "window", labels, r["window_auc"])
        f.add("zbus_stream_broker_down", "1 while the feeder cannot reach the broker", labels,
              r["broker_down_since"] is not None)
        f.add("zbus_stream_acks_refused", "Acknowledgements the broker did not take (Kafka: "
              "commits refused mid-rebalance): their messages come again", labels,
              r.get("acks_refused", 0), counter=True)
        for task, figures in (r["tasks"] or {}).items():
            f.add("zbus_stream_task_progressive_auc", "Several labels: a label's progressive "
                  "AUC, over the feeder's events that have it", {**labels, "task": task},
                  figures.get("progressive_auc"))
            f.add("zbus_stream_task_window_auc", "Several labels: the AUC of a label's newest "
                  "closed window", {**labels, "task": task}, figures.get("window_auc"))
        join = r.get("join")
        if join:
            for outcome in ("joined", "expired_negative", "labels_late", "labels_unmatched"):
                f.add("zbus_stream_join_total", "Labels from their own topic: impressions "
                      "joined or trained as negatives, labels late or unmatched",
                      {**labels, "outcome": outcome}, join.get(outcome, 0), counter=True)
            f.add("zbus_stream_join_waiting", "Impressions waiting in the join for their label",
                  labels, join.get("impressions_waiting", 0))


def _node(f: Families, labels: dict[str, str], n: NodeRow) -> None:
    f.add("zbus_node_up", "1 while control hears the node (alive or suspect)", labels,
          n.get("state") in ("alive", "suspect"))
    f.add("zbus_node_suspect", "1 while the node is late (heartbeat or probe)", labels,
          n.get("state") == "suspect")
    f.add("zbus_node_cpu_percent", "The node's CPU use (100 = one core)", labels, n.get("cpu"))
    f.add("zbus_node_memory_bytes", "The node's resident memory", labels, n.get("rss"))
    for direction in ("in", "out"):
        d = {**labels, "direction": direction}
        f.add("zbus_node_bus_bytes", "Bytes the node received or sent through zbus sockets",
              d, n.get(f"bytes_{direction}"), counter=True)
        f.add("zbus_node_bus_bytes_per_second", "Bus bytes per second, in or out", d,
              n.get(f"{direction}_per_s"))
    f.add("zbus_node_samples_per_second", "Samples per second (workers trained, feeders "
          "acknowledged)", labels, n.get("samples_per_s"))
    f.add("zbus_node_queue", "Feeder: batches in flight; worker: its pipeline; shard: "
          "batches held and look-ups waiting", labels, n.get("backlog"))
    f.add("zbus_node_heartbeat_age_seconds", "Seconds since the node's last message", labels,
          n.get("beat_age_s"))


def _partition(f: Families, job: dict[str, str], e: EmbeddingsView) -> None:
    for s in e.get("shards", []):
        labels = {**job, "shard": str(s.get("shard"))}
        f.add("zbus_shard_keys", "Embedding keys the shard holds", labels, s.get("keys"))
        f.add("zbus_shard_keys_per_second", "Keys the shard serves per second", labels,
              s.get("keys_per_s"))
        f.add("zbus_shard_load_share", "The shard's share of the keys served", labels,
              s.get("share"))
    f.add("zbus_placement_imbalance", "Max ÷ mean keys served per shard", job,
          e.get("imbalance"))
    skew = e.get("skew_aware")
    if isinstance(skew, dict):
        f.add("zbus_placement_keymap_version", "Skew-aware placement: the key map's version",
              job, skew.get("version"))
        f.add("zbus_placement_migrations", "Skew-aware placement: key migrations", job,
              skew.get("migrations"), counter=True)
        f.add("zbus_placement_moved_keys", "Skew-aware placement: keys moved", job,
              skew.get("moved_keys"), counter=True)
