"""summary.json's figures, assembled from what control collected (pure): one builder per part
of the summary's layout (``roles.job.summary``) that comes from the nodes' counters, the job and
the epochs' records; control adds the parts its components hold (``roles.control.summary``)."""

from __future__ import annotations

from typing import Any

from roles.job.fields import FieldLayout
from roles.job.settings import Job
from roles.job.summary import (
    DataRows,
    EmbeddingWaits,
    ExactlyOnce,
    FeederFigures,
    Feeding,
    Load,
    Outcome,
    PartsFigures,
    Results,
    Shards,
    TableFigures,
    TaskFigures,
    Throughput,
    Traffic,
    WorkerEmbeddingWaits,
    Workers,
    WorkerWaits,
)
from zbus.endpoints import node_index

WORKER_TIMES = ("compute_s", "lookup_wait_s", "step_wait_s")
# every channel of roles.protocol's messages but "status" (control's, for consoles only);
# tests/zbus/test_wire.py checks that none is missing
CHANNELS = ("samples", "keys", "lookups", "deliveries", "embeddings", "embedding_grads",
            "dense_sync", "handover", "model_parallel", "acks", "serving", "control")


def _num(value: Any) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def channel_bytes(counters: list[dict[str, Any]], direction: str = "bytes_out") -> dict[str, int]:
    """Bytes per channel summed over the nodes: sent (each message counted once, by its
    sender), or received (a message published to N subscribers counts N times)."""
    total = dict.fromkeys(CHANNELS, 0)
    for c in counters:
        sent = c.get(direction)
        if isinstance(sent, dict):
            for channel, n in sent.items():
                if channel in total:
                    total[channel] += int(_num(n))
    return total


def feeder_totals(counters: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The feeders' counters added up (numbers summed, ``acked_by`` merged): the job's
    figures whether one feeder or several fed it."""
    total: dict[str, Any] = {}
    acked_by: dict[str, int] = {}
    for node, c in counters.items():
        if not node.startswith("feeder-"):
            continue
        for key, value in c.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
        if isinstance(c.get("acked_by"), dict):
            for worker, n in c["acked_by"].items():
                acked_by[worker] = acked_by.get(worker, 0) + int(_num(n))
    total["acked_by"] = acked_by
    return total


def worker_input(counters: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Bytes each worker received per sample it trained or scored, by channel."""
    out = {}
    for node, c in sorted(counters.items(), key=lambda kv: node_index(kv[0])):
        received = c.get("bytes_in")
        samples = _num(c.get("samples_trained")) + _num(c.get("eval_samples"))
        if node.startswith("worker-") and isinstance(received, dict) and samples:
            per = {ch: round(_num(n) / samples, 1) for ch, n in sorted(received.items())}
            out[node] = {**per, "total": round(sum(per.values()), 1)}
    return out


DATA_PATH = ("samples", "keys", "lookups", "deliveries", "embeddings", "embedding_grads",
             "acks")  # the channels a batch's messages travel on (not dense_sync, control)


def data_path_messages(counters: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Data-path messages (``DATA_PATH`` channels) each feeder, shard and worker sent and
    received per batch: a worker's per batch it trained or scored, the others' per batch of
    the job (every worker's added up)."""
    mine = {node: int(_num(c.get("batches_trained")) + _num(c.get("batches_scored")))
            for node, c in counters.items() if node.startswith("worker-")}
    batches = sum(mine.values())
    out = {}
    for node, c in sorted(counters.items(), key=lambda kv: (kv[0].split("-")[0],
                                                             node_index(kv[0]))):
        if not node.startswith(("worker-", "feeder-", "ps-")):
            continue
        n = mine.get(node, batches)
        if not n:
            continue
        row: dict[str, float] = {}
        for way, key in (("sent", "msgs_out"), ("received", "msgs_in")):
            got = c.get(key)
            by = {ch: _num(v) for ch, v in (got if isinstance(got, dict) else {}).items()
                  if ch in DATA_PATH}
            row[way] = round(sum(by.values()) / n, 3)
            row.update({f"{way}_{ch}": round(v / n, 3) for ch, v in sorted(by.items()) if v})
        out[node] = row
    return out


def embedding_waits(counters: dict[str, dict[str, Any]], mode: str) -> EmbeddingWaits:
    """Per-batch waits for embeddings (ms): each worker's sample of them, and all together;
    ``mode``: how the workers get them (``[train] embeddings``)."""
    every: list[float] = []
    per_worker: dict[str, WorkerEmbeddingWaits] = {}
    batches = messages = 0
    for node, c in sorted(counters.items(), key=lambda kv: node_index(kv[0])):
        waits = c.get("embedding_wait_ms")
        if not node.startswith("worker-") or not isinstance(waits, list) or not waits:
            continue
        waits = sorted(float(_num(w)) for w in waits)
        every += waits
        sent, got = c.get("msgs_out"), c.get("msgs_in")
        # the messages a worker's embeddings took: its look-ups out (those that rode with
        # gradients, GradsLookup, counted as look-ups), the replies in
        moved = int(_num((sent if isinstance(sent, dict) else {}).get("lookups"))
                    + _num(c.get("lookups_with_grads"))
                    + _num((got if isinstance(got, dict) else {}).get("embeddings")))
        done = int(_num(c.get("embedding_waits")))
        batches, messages = batches + done, messages + moved
        per_worker[node] = {"batches": done, "messages": moved,
                            "median_ms": _quantile(waits, 0.5), "p90_ms": _quantile(waits, 0.9)}
    every.sort()
    return {"mode": mode, "median_ms": _quantile(every, 0.5) if every else None,
            "p90_ms": _quantile(every, 0.9) if every else None,
            "messages_per_batch": round(messages / batches, 3) if batches else None,
            "workers": per_worker}


TABLE_FIGURES = ("rows", "admitted", "rejected", "rejected_keys", "expired", "evicted",
                 "free_rows", "sketch_bytes", "table_bytes")


def table_figures(job: Job, counters: dict[str, dict[str, Any]]) -> TableFigures:
    """What kept the shards' tables bounded (``[embeddings]``): the settings, and per shard
    (its heartbeat's ``table`` counters) the keys held, keys admitted by a look-up, key
    occurrences mapped to a default row (rejected for now), rows expired and evicted, free
    rows, the sketch's and the table's bytes; ``total`` adds the shards up."""
    e = job.embeddings
    shards = {}
    for node, c in sorted(counters.items(), key=lambda kv: node_index(kv[0])):
        table = c.get("table")
        if node.startswith("ps-") and isinstance(table, dict):
            shards[node] = {k: int(_num(table.get(k))) for k in TABLE_FIGURES}
    total = {k: sum(s[k] for s in shards.values()) for k in TABLE_FIGURES}
    return {"min_count": e.min_count, "expire_batches": e.expire_batches,
            "expire_s": e.expire_s, "max_rows_per_shard": e.max_rows_per_shard,
            "sketch_mb": e.sketch_mb if e.min_count > 1 else 0, "total": total,
            "shards": shards}


def worker_waits(counters: dict[str, dict[str, Any]]) -> WorkerWaits:
    """What the workers waited for between batches (``roles.algorithms.worker.pulled.WaitClock``):
    seconds by reason per worker, and all workers' milliseconds per batch they ran."""
    per_worker: dict[str, dict[str, float]] = {}
    total: dict[str, float] = {}
    batches = 0
    for node, c in sorted(counters.items(), key=lambda kv: node_index(kv[0])):
        waits = c.get("waiting_s")
        if not node.startswith("worker-") or not isinstance(waits, dict):
            continue
        per_worker[node] = {k: round(float(_num(v)), 3) for k, v in waits.items()}
        for k, v in waits.items():
            total[k] = total.get(k, 0.0) + float(_num(v))
        batches += int(_num(c.get("batches_trained"))) + int(_num(c.get("batches_scored")))
    return {"batches": batches, "workers": per_worker,
            "ms_per_batch": {k: round(1000 * v / batches, 3) for k, v in total.items()}
            if batches else {}}


def _quantile(sorted_values: list[float], q: float) -> float:
    return round(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))], 3)


def field_figures(layout: FieldLayout, feeder: dict[str, Any]) -> list[dict[str, Any]]:
    """Per sparse field: its kind, table and width, and for a list field the ids a sample held
    on average and the fraction of samples whose list was full (at ``max_len``: older ids may
    have been dropped), over the batches the feeders sent. A weight per id's field
    (``wide:``, ``cross:``: kind ``weights per id`` or ``cross``) names the fields it is made
    of (``of``)."""
    samples = _num(feeder.get("list_samples"))
    out = []
    for f, name in enumerate(layout.fields):
        made_of = layout.sources[f] if f < len(layout.sources) else ()
        kind = "sequence" if layout.pooling[f] == "none" else \
            f"list ({layout.pooling[f]})" if layout.is_list(f) else "single"
        if made_of:
            kind = "cross" if len(made_of) > 1 else "weights per id"
        row: dict[str, Any] = {"field": name, "kind": kind, "table": layout.tables[f],
                               "dim": layout.dims[f]}
        if made_of:
            row["of"] = [layout.fields[s] for s in made_of]
        elif layout.is_list(f):
            row["max_len"] = layout.widths[f]
            row["ids_per_sample"] = round(_num(feeder.get(f"ids:{name}")) / samples, 2) \
                if samples else None
            row["at_max_len"] = round(_num(feeder.get(f"full:{name}")) / samples, 4) \
                if samples else None
        out.append(row)
    return out




# -- the summary's parts -------------------------------------------------------------------------
Counters = dict[str, dict[str, Any]]   # each node's last counters (its final ones, if it sent them)
SHARD_FIGURES = ("keys", "updates", "duplicates_refused", "keys_received", "rows_sent",
                 "grads_without_keys", "held_dropped", "keys_moved_out", "keys_moved_in",
                 "lookup_s", "update_s")
FEEDER_COUNTS = ("samples_acked", "batches_sent", "bytes_read", "parts_begun_ahead",
                 "parts_held", "parts_read_from_memory")
TAKE_WINDOW = ("take_rtt_ms", "batch_ms", "take_window", "sample_links")
MEMBER_FIGURES = ("steps", "scored", "calls", "device")


def _of_role(counters: Counters, role: str) -> list[tuple[str, dict[str, Any]]]:
    """The nodes of ``role`` and their counters, by name."""
    return [(n, c) for n, c in sorted(counters.items()) if n.startswith(f"{role}-")]


def outcome(job: Job, run_id: str, run_dir: str, status: str, reason: str,
            resume_from: int | None) -> Outcome:
    return {"job": job.name, "run_id": run_id, "run_dir": run_dir, "ok": status == "completed",
            "status": status, "reason": reason, "resume_from": resume_from}


def results(job: Job, epochs: list[dict[str, Any]], data: dict[str, Any]) -> Results:
    """The last evaluated epoch's AUC and log loss, and every epoch's record."""
    evaluated = [e for e in epochs if "auc" in e]
    last = evaluated[-1] if evaluated else {}
    oracles = dict(zip(job.tasks, data.get("oracle_aucs") or [], strict=False))
    tasks: dict[str, TaskFigures] = {
        name: TaskFigures(auc=f["auc"], logloss=f["logloss"], ne=f["ne"],
                          calibration=f["calibration"], gauc=f["gauc"],
                          gauc_groups=f["gauc_groups"], oracle_auc=oracles.get(name))
        for name, f in last.get("tasks", {}).items()}
    return {"auc": last.get("auc"), "logloss": last.get("logloss"),
            "tasks": tasks, "gauc_share": last.get("gauc_share"),
            "oracle_auc": oracles.get(job.tasks[0]), "epochs": len(evaluated),
            "epochs_planned": job.train.epochs, "per_epoch": epochs}


def data_rows(data: dict[str, Any]) -> DataRows:
    """The data's figures as control collected them (``roles.control.feeding``)."""
    return {"samples_in_data": data.get("samples_in_data"),
            "eval_samples": data.get("eval_samples"), "rows_read": data.get("rows_read"),
            "rejected_rows": data.get("rejected_rows"), "dropped_rows": data.get("dropped_rows"),
            "merged_rows": data.get("merged_rows")}


def throughput(job: Job, epochs: list[dict[str, Any]], counters: Counters,
               wall_s: float) -> Throughput:
    """Samples trained, in what time, by which worker. The feeders' reports of finished
    epochs are exact; counters are a lost feeder's last heartbeat's (they miss what it
    acknowledged after it) but count an unfinished epoch: the larger of the two counts."""
    feeder = feeder_totals(counters)
    acked_by = feeder["acked_by"]
    train_s = sum(e.get("train_s", 0.0) for e in epochs)
    samples_trained = max(int(_num(feeder.get("samples_acked"))),
                          sum(int(_num(e.get("train_samples"))) for e in epochs))
    names = {f"worker-{i}" for i in range(job.cluster.workers)} | set(acked_by) | {
        n for n in counters if n.startswith("worker-")}
    return {"samples_trained": samples_trained, "wall_s": round(wall_s, 3),
            "train_s": round(train_s, 3),
            "samples_per_s": round(samples_trained / train_s, 1) if train_s > 0 else None,
            "workers": {w: int(_num(acked_by.get(w))) for w in sorted(names, key=node_index)},
            # what the workers count themselves: more than samples_trained if a batch was
            # trained twice (a lost worker's, or after a lost feeder's handover)
            "samples_trained_by_workers": sum(int(_num(c.get("samples_trained")))
                                              for _, c in _of_role(counters, "worker"))}


def feeding(job: Job, counters: Counters, parts: PartsFigures | None) -> Feeding:
    """Each feeder's figures, the data's parts, the sparse fields."""
    feeders: dict[str, FeederFigures] = {}
    for node, c in _of_role(counters, "feeder"):
        n = {k: int(_num(c.get(k))) for k in FEEDER_COUNTS}
        feeders[node] = {"samples_acked": n["samples_acked"], "batches_sent": n["batches_sent"],
                         "bytes_read": n["bytes_read"],
                         "parts_begun_ahead": n["parts_begun_ahead"],
                         "parts_held": n["parts_held"], "held_mb": float(_num(c.get("held_mb"))),
                         "parts_read_from_memory": n["parts_read_from_memory"]}
    return {"feeders": feeders, "parts": parts,
            "fields": field_figures(job.layout(), feeder_totals(counters))}


def workers(job: Job, counters: Counters) -> Workers:
    """What the workers waited for and received, their take windows and devices."""
    mine = _of_role(counters, "worker")
    return {
        "embeddings": embedding_waits(counters, job.train.embeddings),
        "worker_input_bytes_per_sample": worker_input(counters),
        "data_path_messages": data_path_messages(counters),
        # each worker's take window (TakeWindow): its least round trip to a grant, its batch
        # time, the batches it asked ahead and its connections to each sample queue, at its
        # last heartbeat
        "take_windows": {node: {k: c.get(k) for k in TAKE_WINDOW}
                         for node, c in sorted(mine, key=lambda kv: node_index(kv[0]))},
        "batch_by_label": job.train.batch_by_label,
        "worker_time_s": {node: {k: round(_num(c.get(k)), 3) for k in WORKER_TIMES}
                          for node, c in mine},
        "worker_devices": {node: c.get("device") for node, c in mine},
        "worker_waits": worker_waits(counters)}


def load(counters: Counters) -> Load:
    """Per node: the fraction of its life not spent waiting for messages, and the longest
    one turn of its event loop kept it from its sockets."""
    return {"busy": {node: round(1 - _num(c.get("idle_s")) / _num(c["uptime_s"]), 3)
                     for node, c in sorted(counters.items()) if _num(c.get("uptime_s")) > 0},
            "longest_turn_s": {node: round(_num(c.get("longest_turn_s")), 4)
                               for node, c in sorted(counters.items())
                               if "longest_turn_s" in c}}


def exactly_once(counters: Counters) -> ExactlyOnce:
    """What kept every sample trained once: batches sent again, and duplicates refused."""
    feeder = feeder_totals(counters)
    return {"requeued_batches": int(_num(feeder.get("requeued_batches"))),
            "straggler_copies": int(_num(feeder.get("straggler_copies"))),
            "duplicates_refused": {
                "embedding_updates": sum(int(_num(c.get("duplicates_refused")))
                                         for _, c in _of_role(counters, "ps")),
                "acks": int(_num(feeder.get("duplicate_acks"))),
                "batch_copies": int(_num(feeder.get("refused_takes")))}}


def traffic(counters: Counters) -> Traffic:
    """Bytes per channel, sent and received, and the messages each node rejected."""
    every = list(counters.values())
    return {"bytes": channel_bytes(every), "bytes_received": channel_bytes(every, "bytes_in"),
            "rejected_messages": {node: c["rejected_messages"]
                                  for node, c in sorted(counters.items())
                                  if isinstance(c.get("rejected_messages"), dict)
                                  and c["rejected_messages"]}}


def shards(job: Job, counters: Counters, placement: dict[str, Any],
           model_plan: dict[str, Any] | None) -> Shards:
    """The shards' figures and tables, the keys' placement, and the network's partition
    (``parts`` > 1: the plan's figures and each group member's)."""
    return {"shards": {node: {k: c.get(k) for k in SHARD_FIGURES}
                       for node, c in _of_role(counters, "ps")},
            "tables": table_figures(job, counters),
            "placement": placement,
            "model_parallel": None if model_plan is None else {
                **model_plan, "members": {n: {k: c.get(k) for k in MEMBER_FIGURES}
                                          for n, c in _of_role(counters, "member")}}}
