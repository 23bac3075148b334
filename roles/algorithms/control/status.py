"""What control publishes for consoles (pure: control feeds it heartbeats and the clock).

``StatusBuilder`` turns the cumulative counters of heartbeats into rates (bus bytes in and out
per second, samples per second, keys per second), keeps a short history of the training loss
and throughput, and lays out the snapshot's rows: each node's (``node_rows``), the training's
(``training``) and the shards' (``embeddings``). The snapshot's layout, every key of it, is
``roles.protocol.status.StatusSnapshot``; control assembles it
(``roles.control.operators.StatusView``).

``state`` is the node's health as control sees it: alive, suspect (silent for more than
``SUSPECT_BEATS`` heartbeats or a probe unanswered past ``probe_timeout_s``, not yet failed),
failed or left; ``doing`` is what the node says it does (loading, training, ...).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, cast

from roles.algorithms.control.membership import ALIVE, NodeState
from roles.protocol.status import EmbeddingsView, NodeRow, ShardRow, TaskFigures, TrainingView

SUSPECT_BEATS = 2.5
HISTORY_POINTS = 120
# the epochs' figures a status carries: the newest (a status goes to every console each
# heartbeat, so it must not grow with the job; the summary keeps every epoch)
STATUS_EPOCHS = 100
# the counter whose rate is a role's samples per second, and those that make its backlog
SAMPLE_COUNTER = {"worker": "samples_trained", "feeder": "samples_acked"}
BACKLOG_COUNTERS = {"feeder": ("in_flight",), "worker": ("pipeline",),
                    "ps": ("held_batches", "waiting_lookups")}


def _total(counter: object) -> float:
    """Bytes of a per-channel counter ({channel: bytes}) in all."""
    if isinstance(counter, dict):
        return sum(v for v in counter.values() if isinstance(v, (int, float)))
    return 0


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


@dataclass
class Rates:
    """A node's last cumulative figures and the rates between its last two heartbeats."""

    at: float
    totals: dict[str, float]
    per_s: dict[str, float]


class StatusBuilder:
    def __init__(self, heartbeat_s: float, started: float):
        self.heartbeat_s = heartbeat_s
        self.started = started
        self.rates: dict[str, Rates] = {}
        self.history_every_s = max(1.0, heartbeat_s)
        self.next_point = started + self.history_every_s
        self.history: deque[tuple[float, float | None, float]] = deque(maxlen=HISTORY_POINTS)
        self.last_loss: tuple[float, float] | None = None  # feeder's (loss sum, weight sum)

    # -- inputs ----------------------------------------------------------------------------
    def heard(self, node_id: str, role: str, counters: dict[str, Any], now: float) -> None:
        """A heartbeat's counters: the rates since the node's previous heartbeat."""
        totals: dict[str, float] = {"in": _total(counters.get("bytes_in")),
                                    "out": _total(counters.get("bytes_out"))}
        samples = _number(counters.get(SAMPLE_COUNTER.get(role, "")))
        if samples is not None:
            totals["samples"] = samples
        keys = _number(counters.get("keys_received")) if role == "ps" else None
        if keys is not None:
            totals["keys"] = keys
        before = self.rates.get(node_id)
        per_s: dict[str, float] = {}
        if before is not None and now > before.at:
            dt = now - before.at
            per_s = {k: round(max(0.0, (v - before.totals[k]) / dt), 1)
                     for k, v in totals.items() if k in before.totals}
        elif before is not None:
            per_s = before.per_s
        self.rates[node_id] = Rates(now, totals, per_s)

    def tick(self, now: float, feeding: dict[str, Any] | None) -> None:
        """Add a history point (loss and throughput) once per ``history_every_s``."""
        if now < self.next_point:
            return
        self.next_point = now + self.history_every_s
        if not feeding:
            return
        loss_sum = _number(feeding.get("train_loss_sum"))
        weight_sum = _number(feeding.get("train_weight_sum"))
        loss = None
        if loss_sum is not None and weight_sum is not None:
            if self.last_loss is not None and weight_sum > self.last_loss[1]:
                loss = (loss_sum - self.last_loss[0]) / (weight_sum - self.last_loss[1])
            self.last_loss = (loss_sum, weight_sum)
        rate = self.feeding_rate()
        self.history.append((round(now - self.started, 2),
                             None if loss is None else round(loss, 5), round(rate, 1)))

    def feeding_rate(self) -> float:
        """Samples acknowledged per second, over every feeder."""
        return sum(self.rate(n, "samples") or 0.0 for n in self.rates if n.startswith("feeder-"))

    def rate(self, node_id: str, name: str) -> float | None:
        rates = self.rates.get(node_id)
        return rates.per_s.get(name) if rates else None

    def total(self, node_id: str, name: str) -> float | None:
        """A node's cumulative figure (bus bytes in or out) as of its last heartbeat."""
        rates = self.rates.get(node_id)
        return rates.totals.get(name) if rates else None

    # -- the snapshot's parts ----------------------------------------------------------------
    def health(self, node: NodeState, now: float, probe_timeout_s: float) -> str:
        if node.status != ALIVE:
            return node.status
        silent = now - node.last_seen > SUSPECT_BEATS * self.heartbeat_s
        unanswered = (node.probe_pending_since is not None
                      and now - node.probe_pending_since > probe_timeout_s)
        return "suspect" if silent or unanswered else ALIVE

    def node_rows(self, nodes: dict[str, NodeState], now: float,
                  probe_timeout_s: float) -> list[NodeRow]:
        rows: list[NodeRow] = []
        for node_id, node in nodes.items():
            load, counters = node.load, node.counters
            backlog = [_number(counters.get(k)) for k in BACKLOG_COUNTERS.get(node.role, ())]
            known = [b for b in backlog if b is not None]
            rows.append({
                "id": node_id, "role": node.role, "index": node.index, "host": node.host,
                "pid": node.pid, "state": self.health(node, now, probe_timeout_s),
                "doing": "paused" if counters.get("paused") is True else node.state,
                "cpu": _number(load.get("cpu")),
                "rss": _number(load.get("rss")),
                "in_per_s": self.rate(node_id, "in"), "out_per_s": self.rate(node_id, "out"),
                "bytes_in": self.total(node_id, "in"), "bytes_out": self.total(node_id, "out"),
                "samples_per_s": self.rate(node_id, "samples"),
                "backlog": int(sum(known)) if backlog and len(known) == len(backlog) else None,
                "round_samples": _number(counters.get("round_samples")),
                "beat_age_s": round(max(0.0, now - node.last_seen), 2),
                "progress": _progress(counters.get("progress")),
            })
        return rows

    def training(self, *, feeding: dict[str, Any] | None, samples_per_epoch: int, epoch: int,
                 epochs: int, epochs_done: list[dict[str, Any]],
                 running: bool = True) -> TrainingView:
        """Progress of the epoch, the ETAs (none unless ``running``), the history and the
        newest ``STATUS_EPOCHS`` epochs' figures."""
        counters = feeding or {}
        epoch_samples = int(_number(counters.get("epoch_samples")) or 0)
        rate = self.feeding_rate()
        eta_epoch = eta_job = None
        if running and rate > 0 and samples_per_epoch and epoch >= 0:
            left = max(0, samples_per_epoch - epoch_samples)
            eta_epoch = round(left / rate, 1)
            eta_job = round((left + max(0, epochs - epoch - 1) * samples_per_epoch) / rate, 1)
        points = list(self.history)
        return {"samples_acked": int(_number(counters.get("samples_acked")) or 0),
                "epoch_samples": epoch_samples, "samples_per_epoch": samples_per_epoch,
                "samples_per_s": round(rate, 1), "eta_epoch_s": eta_epoch,
                "eta_job_s": eta_job,
                "history": {"t": [p[0] for p in points], "loss": [p[1] for p in points],
                            "samples_per_s": [p[2] for p in points]},
                "epochs": [{"epoch": int(e["epoch"]), "train_loss": e.get("train_loss"),
                            "auc": e.get("auc"), "logloss": e.get("logloss"),
                            "tasks": e.get("tasks", {})}
                           for e in epochs_done[-STATUS_EPOCHS:]]}

    def embeddings(self, nodes: dict[str, NodeState], skew: dict[str, Any] | None = None,
                   bounds: dict[str, Any] | None = None) -> EmbeddingsView:
        """The shards: keys each holds, keys per second it serves, and what keeps its table
        bounded (keys admitted, key occurrences rejected for now, rows expired and evicted;
        ``bounds``: the job's ``[embeddings]`` settings); with skew-aware placement (``skew``:
        control's placement state) also each shard's predicted capacity and assigned pairs of
        the last window, its overflowing heavy keys and keys moved in."""
        shards = sorted((n for n in nodes.values() if n.role == "ps"), key=lambda n: n.index)
        rates = [self.rate(f"ps-{n.index}", "keys") or 0.0 for n in shards]
        total = sum(rates)
        rows = [_shard_row(n, r, total) for n, r in zip(shards, rates, strict=True)]
        imbalance = round(max(rates) / (total / len(rates)), 3) if total else None
        if skew is not None:
            for row, n in zip(rows, shards, strict=True):
                row["capacity"] = _of_shard(skew.get("capacity"), n.index)
                row["assigned"] = _of_shard(skew.get("assigned"), n.index)
                row["overflow"] = _of_shard(skew.get("overflow_by_shard"), n.index)
                row["moved"] = int(_number(n.counters.get("keys_moved_in")) or 0)
                row["slowdown"] = _number(n.counters.get("slowdown"))
        return {"placement": "skew" if skew is not None else "hash", "shards": rows,
                "imbalance": imbalance, "skew_aware": skew, "bounds": bounds}


def _progress(figures: object) -> TaskFigures | None:
    """A node's task figures as its heartbeat gave them (``Progress.figures``), or None."""
    return cast(TaskFigures, figures) if isinstance(figures, dict) else None


def _of_shard(values: object, shard: int) -> Any:
    """A per-shard list's value for ``shard`` (None where the list does not reach it)."""
    return values[shard] if isinstance(values, list) and shard < len(values) else None


def _shard_row(n: NodeState, keys_per_s: float, total: float) -> ShardRow:
    """A shard's keys, its rate and share of the keys served, and its table's figures (its
    heartbeat's ``table`` counters; None where it does not say)."""
    table = n.counters.get("table")
    got: dict[str, Any] = table if isinstance(table, dict) else {}

    def figure(name: str) -> int | None:
        value = _number(got.get(name))
        return None if value is None else int(value)

    return {"shard": n.index, "keys": int(_number(n.counters.get("keys")) or 0),
            "keys_per_s": round(keys_per_s, 1),
            "share": round(keys_per_s / total, 4) if total else None,
            "admitted": figure("admitted"), "rejected": figure("rejected"),
            "expired": figure("expired"), "evicted": figure("evicted")}
