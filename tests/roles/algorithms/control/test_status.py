"""The status control publishes for consoles, and the console's formatting (pure)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from harness import REPO

from console import format as fmt
from roles.algorithms.control.membership import FAILED, NodeState
from roles.algorithms.control.status import StatusBuilder
from roles.protocol.operator import Status
from roles.protocol.status import STATUS_LAYOUT
from zbus.codec import ProtocolError, decode


def node(role: str, index: int, last_seen: float = 0.0, **counters) -> NodeState:
    return NodeState(role, index, "h", 100 + index, last_seen, counters=counters,
                     load={"cpu": 12.5, "rss": 2048})


def test_rates_come_from_consecutive_heartbeats_and_never_go_negative():
    b = StatusBuilder(heartbeat_s=1.0, started=0.0)
    b.heard("worker-0", "worker", {"samples_trained": 100, "bytes_in": {"a": 10, "b": 5},
                                   "bytes_out": {"a": 0}}, now=1.0)
    assert b.rate("worker-0", "samples") is None  # one heartbeat: no rate yet
    b.heard("worker-0", "worker", {"samples_trained": 400, "bytes_in": {"a": 1010, "b": 5},
                                   "bytes_out": {"a": 50}}, now=3.0)
    assert b.rate("worker-0", "samples") == 150.0
    assert b.rate("worker-0", "in") == 500.0 and b.rate("worker-0", "out") == 25.0
    b.heard("worker-0", "worker", {"samples_trained": 0, "bytes_in": {}, "bytes_out": {}},
            now=4.0)  # a restarted process starts its counters at 0
    assert b.rate("worker-0", "samples") == 0.0
    b.heard("ps-0", "ps", {"keys_received": "junk", "bytes_in": None}, now=4.0)
    assert b.rate("ps-0", "keys") is None  # a malformed counter is no figure, not a crash


def test_health_alive_suspect_failed_and_the_row_figures():
    b = StatusBuilder(heartbeat_s=1.0, started=0.0)
    nodes = {"worker-0": node("worker", 0, last_seen=9.5, round_samples=77, pipeline=3),
             "worker-1": node("worker", 1, last_seen=7.0),
             "ps-0": node("ps", 0, last_seen=9.9, held_batches=2, waiting_lookups=1),
             "feeder-0": node("feeder", 0, last_seen=9.9, in_flight=4, paused=True)}
    nodes["worker-1"].status = FAILED
    nodes["ps-0"].probe_pending_since = 5.0   # unanswered for 5 s > probe timeout 3 s
    rows = {r["id"]: r for r in b.node_rows(nodes, now=10.0, probe_timeout_s=3.0)}
    assert rows["worker-0"]["state"] == "alive" and rows["worker-1"]["state"] == "failed"
    assert rows["ps-0"]["state"] == "suspect"
    nodes["worker-0"].last_seen = 7.0  # silent for 3 heartbeats: suspect before failed
    assert b.node_rows(nodes, 10.0, 3.0)[0]["state"] == "suspect"
    assert rows["worker-0"]["round_samples"] == 77 and rows["worker-0"]["backlog"] == 3
    assert rows["ps-0"]["backlog"] == 3 and rows["feeder-0"]["backlog"] == 4
    assert rows["feeder-0"]["doing"] == "paused"
    assert rows["worker-0"]["beat_age_s"] == 0.5 and rows["worker-0"]["cpu"] == 12.5


def test_training_history_eta_and_shard_shares():
    b = StatusBuilder(heartbeat_s=0.25, started=0.0)
    feeder = node("feeder", 0, samples_acked=0, train_loss_sum=0.0, train_weight_sum=0.0,
                  epoch_samples=0)
    b.heard("feeder-0", "feeder", feeder.counters, now=0.5)
    b.tick(1.0, feeder.counters)                       # the first point has no loss yet
    feeder.counters = {"samples_acked": 1000, "train_loss_sum": 50.0,
                       "train_weight_sum": 100.0, "epoch_samples": 1000}
    b.heard("feeder-0", "feeder", feeder.counters, now=1.5)
    b.tick(2.0, feeder.counters)
    b.tick(2.5, feeder.counters)                       # within history_every_s: no point
    t = b.training(feeding=feeder.counters, samples_per_epoch=5000, epoch=0, epochs=2,
                   epochs_done=[])
    assert t["history"]["loss"] == [None, 0.5] and t["history"]["samples_per_s"][-1] == 1000
    assert t["samples_per_s"] == 1000.0
    assert t["eta_epoch_s"] == 4.0 and t["eta_job_s"] == 9.0  # 4000 + 5000 samples left
    done = [{"epoch": e, "train_loss": 0.5, "auc": 0.7, "logloss": 0.4} for e in range(4095)]
    t = b.training(feeding=feeder.counters, samples_per_epoch=5000, epoch=4095, epochs=4095,
                   epochs_done=done)
    # a status does not grow with the job: the newest 100 epochs (#33: 98 KB after 899 epochs)
    assert [e["epoch"] for e in t["epochs"]] == list(range(3995, 4095))
    ps = {f"ps-{i}": node("ps", i, keys=10 * (i + 1)) for i in range(2)}
    for i, per_s in enumerate((300, 100)):
        b.heard(f"ps-{i}", "ps", {"keys_received": 0}, now=0.0)
        b.heard(f"ps-{i}", "ps", {"keys_received": per_s}, now=1.0)
    e = b.embeddings(ps)
    assert [s["share"] for s in e["shards"]] == [0.75, 0.25] and e["imbalance"] == 1.5
    assert e["placement"] == "hash" and e["skew_aware"] is None


def test_status_body_round_trips_and_a_bad_body_is_refused():
    """A snapshot of 500 nodes (more than a header holds) comes back whole; a body that is not
    a JSON object, is of another layout's version, or lacks a key of the layout is refused."""
    snap = orjson.loads((REPO / "tests" / "data" / "console_status.json").read_bytes())
    snap["nodes"] = snap["nodes"][:1] * 500
    msg = decode(Status.of("run-1", snap).to_frames("control-0", 3)).msg
    assert msg.run_id == "run-1" and msg.snapshot() == snap
    older = {**snap, "layout": STATUS_LAYOUT - 1}
    partial = {k: v for k, v in snap.items() if k not in ("tasks", "final")}
    for body, why in ((b"not json", "not JSON"), (b"[1, 2]", "not a JSON object"),
                      (orjson.dumps(older), f"status layout {STATUS_LAYOUT - 1}, this reader"),
                      (orjson.dumps(partial), "status without final, tasks")):
        bad = Status(run_id="r", body=np.frombuffer(body, np.uint8))
        with pytest.raises(ProtocolError, match=why):
            decode(bad.to_frames()).msg.snapshot()


def test_formatting_and_node_order():
    assert fmt.size(512) == "512B" and fmt.size(3.5 * 1024) == "3.5K"
    assert fmt.size(150 * 1024 ** 2) == "150M" and fmt.size(None) == "-"
    assert fmt.count(12_345) == "12.3k" and fmt.duration(200) == "3m20s"
    assert fmt.duration(7500) == "2h05m"
    # 0.5 on a scale of 0.6: 8 of 10 cells filled, the limit's cell showing the mark
    assert fmt.gauge(0.5, 0.3, width=10).plain == "█████|██░░"
    assert fmt.gauge(0.0, 0.3, width=10).plain == "░░░░░|░░░░"
    rows = [{"id": "worker-1", "role": "worker", "index": 1, "state": "alive", "cpu": 5.0},
            {"id": "worker-0", "role": "worker", "index": 0, "state": "failed", "cpu": None},
            {"id": "feeder-0", "role": "feeder", "index": 0, "state": "alive", "cpu": 50.0}]
    assert [r["id"] for r in fmt.sort_nodes(rows, "role")] == ["feeder-0", "worker-0",
                                                               "worker-1"]
    assert [r["id"] for r in fmt.sort_nodes(rows, "state")][0] == "worker-0"
    assert [r["id"] for r in fmt.sort_nodes(rows, "cpu")] == ["feeder-0", "worker-1",
                                                              "worker-0"]


def test_each_shards_table_figures_and_the_bounds_reach_the_status():
    b = StatusBuilder(heartbeat_s=1.0, started=0.0)
    table = {"rows": 50, "admitted": 70, "rejected": 900, "expired": 20, "evicted": 3}
    ps = {"ps-0": node("ps", 0, keys=50, table=table), "ps-1": node("ps", 1, keys=4)}
    bounds = {"min_count": 3, "sketch_mb": 16.0, "expire_batches": 2000, "expire_s": 0.0,
              "max_rows_per_shard": 1_000_000}
    e = b.embeddings(ps, bounds=bounds)
    first, second = e["shards"]
    assert {k: first[k] for k in ("admitted", "rejected", "expired", "evicted")} == {
        "admitted": 70, "rejected": 900, "expired": 20, "evicted": 3}
    assert second["admitted"] is None   # a shard that reports no table figures
    assert e["bounds"] == bounds
    from console.panels import bounds_text
    assert bounds_text(bounds).plain == ("embedding tables: min_count 3 (sketch 16 MiB), "
                                         "expire 2.0k batches, cap 1.0M keys")
    assert "unbounded" in bounds_text({**bounds, "min_count": 1, "expire_batches": 0,
                                       "max_rows_per_shard": 0}).plain


def test_the_list_fields_ids_per_sample_show_under_the_tables_only_when_a_job_has_lists():
    from console.panels import lists_text
    from roles.algorithms.control.summary import field_figures
    from roles.job.fields import FieldLayout
    layout = FieldLayout.of(["c0", "genres", "item", "history"],
                            {"genres": "|", "history": "|"}, {"item": ["item", "history"]}, 8,
                            {}, {"history": "none"}, {"genres": 3, "history": 20})
    feeder = {"list_samples": 4, "ids:genres": 8, "full:genres": 1, "ids:history": 42,
              "full:history": 2}
    figures = field_figures(layout, feeder)
    assert [f["kind"] for f in figures] == ["single", "list (mean)", "single", "sequence"]
    assert figures[3] == {"field": "history", "kind": "sequence", "table": "item", "dim": 8,
                          "max_len": 20, "ids_per_sample": 10.5, "at_max_len": 0.5}
    assert lists_text(figures).plain == ("\nlist fields: genres (mean) 2.0 ids, 25% at 3   "
                                         "history (sequence, table item) 10.5 ids, 50% at 20")
    singles = FieldLayout.of(["c0", "c1"], {}, {}, 8, {}, {}, {})
    assert lists_text(field_figures(singles, {})).plain == ""
    wide = field_figures(layout.with_derived(1, [["c0", "item"]]), feeder)   # wide_deep's
    assert [(f["field"], f["kind"], f.get("of")) for f in wide[4:]] == [
        ("wide:c0", "weights per id", ["c0"]), ("wide:genres", "weights per id", ["genres"]),
        ("wide:item", "weights per id", ["item"]),
        ("wide:history", "weights per id", ["history"]),
        ("cross:c0*item", "cross", ["c0", "item"])]
    assert lists_text(wide).plain == lists_text(figures).plain   # the data's lists only
