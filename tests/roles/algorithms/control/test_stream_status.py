"""A stream job's part of the status (``roles.algorithms.control.stream_status``), its
Prometheus figures and the console's line of it."""

from __future__ import annotations

from console.training import stream_line
from roles.algorithms.control.stream_status import GROWING_POINTS, StreamStatus
from roles.control.prometheus import Families, _stream


def feeder(trained: int, lag: int | None, auc: float | None = 0.8, down: float | None = None):
    return {"stream": {"events_read": trained + 10, "events_trained": trained,
                       "events_rejected": 1, "lag_events": lag, "lag_s": 0.5,
                       "progressive_auc": auc, "window_auc": auc, "broker_down_since": down}}


def test_the_jobs_lag_adds_the_feeders_up_and_is_unknown_while_one_has_not_said():
    s = StreamStatus()
    v = s.view(1.0, {"feeder-0": feeder(100, 20), "feeder-1": feeder(50, 5)})
    assert v["events_trained"] == 150 and v["lag_events"] == 25 and v["lag_s"] == 0.5
    assert [r["node"] for r in v["feeders"]] == ["feeder-0", "feeder-1"]
    v = s.view(2.0, {"feeder-0": feeder(300, 20), "feeder-1": feeder(50, None)})
    assert v["lag_events"] is None
    assert v["history"]["events_per_s"][-1] == 200.0   # (350 - 150) / 1 s


def test_the_history_keeps_the_lowest_feeders_progressive_auc_and_a_gap_while_none_has_one():
    s = StreamStatus()
    s.view(1.0, {"feeder-0": feeder(10, 5, auc=None), "feeder-1": feeder(10, 5, auc=None)})
    a, b = feeder(100, 5, auc=0.81), feeder(90, 5, auc=0.79)
    b["stream"]["window_auc"] = 0.74   # its newest window fell below its lifetime's
    v = s.view(2.0, {"feeder-0": a, "feeder-1": b})
    assert v["history"]["window_auc"] == [None, 0.74]
    assert v["history"]["progressive_auc"] == [None, 0.79]
    assert len(v["history"]["t"]) == len(v["history"]["window_auc"]) == 2


def test_a_lag_that_rises_at_every_status_is_growing_and_one_that_falls_is_not():
    s = StreamStatus()
    for i in range(GROWING_POINTS):
        assert not s.view(float(i), {"feeder-0": feeder(10 * i, 100 * i)})["growing"]
    v = s.view(float(GROWING_POINTS), {"feeder-0": feeder(99, 100 * GROWING_POINTS)})
    assert v["growing"]
    assert "red" in str(stream_line(v, "training").spans)
    v = s.view(GROWING_POINTS + 1.0, {"feeder-0": feeder(120, 0)})
    assert not v["growing"]
    assert "red" not in str(stream_line(v, "training").spans)


def test_prometheus_has_the_lag_and_each_feeders_figures():
    v = StreamStatus().view(1.0, {"feeder-0": feeder(100, 7, down=12.0)})
    f = Families()
    _stream(f, {"job": "j"}, v)
    assert f.made["zbus_stream_lag_events"].samples[0].value == 7
    assert f.made["zbus_stream_broker_down"].samples[0].value == 1
    assert f.made["zbus_stream_acks_refused"].samples[0].value == 0
    assert "acks refused" not in stream_line(v, "training").plain
    assert f.made["zbus_stream_progressive_auc"].samples[0].labels == {"job": "j",
                                                                        "node": "feeder-0"}
    assert "broker unreachable" in stream_line(v, "training").plain


def test_a_label_join_s_counts_reach_the_status_and_prometheus():
    a = feeder(100, 7)
    a["stream"]["join"] = {"joined": 90, "expired_negative": 10, "labels_late": 2,
                           "labels_unmatched": 3, "impressions_waiting": 40, "bad": "x"}
    v = StreamStatus().view(1.0, {"feeder-0": a, "feeder-1": feeder(5, 0)})
    assert v["feeders"][0]["join"]["joined"] == 90 and "bad" not in v["feeders"][0]["join"]
    assert v["feeders"][1]["join"] is None
    f = Families()
    _stream(f, {"job": "j"}, v)
    got = {s.labels["outcome"]: s.value for s in f.made["zbus_stream_join_total"].samples
           if s.name.endswith("_total")}
    assert got == {"joined": 90, "expired_negative": 10, "labels_late": 2,
                   "labels_unmatched": 3}
    assert f.made["zbus_stream_join_waiting"].samples[0].value == 40


def test_with_several_labels_each_ones_figures_reach_the_status_prometheus_and_the_line():
    """Each label's progressive and window AUC per feeder (its heartbeat's ``tasks``); the
    view keeps each label's lowest over the feeders, which the console's line shows; one
    label: none of it."""
    a, b = feeder(100, 7), feeder(90, 3)
    a["stream"]["tasks"] = {"click": {"progressive_auc": 0.81, "window_auc": 0.80},
                            "buy": {"progressive_auc": 0.70, "window_auc": None}}
    b["stream"]["tasks"] = {"click": {"progressive_auc": 0.78, "window_auc": 0.83},
                            "buy": {"progressive_auc": 0.74, "window_auc": 0.71}}
    v = StreamStatus().view(1.0, {"feeder-0": a, "feeder-1": b})
    assert v["tasks"] == {"click": {"progressive_auc": 0.78, "window_auc": 0.80},
                          "buy": {"progressive_auc": 0.70, "window_auc": 0.71}}
    f = Families()
    _stream(f, {"job": "j"}, v)
    got = {(s.labels["node"], s.labels["task"]): s.value
           for s in f.made["zbus_stream_task_window_auc"].samples}
    assert got[("feeder-1", "buy")] == 0.71 and got[("feeder-0", "click")] == 0.80
    assert len(f.made["zbus_stream_task_progressive_auc"].samples) == 4
    line = stream_line(v, "training").plain
    assert "progressive AUC click 0.7800, buy 0.7000" in line, line
    s = StreamStatus()   # the chart's points: each label's lowest window AUC at each status
    s.view(1.0, {"feeder-0": feeder(10, 1), "feeder-1": feeder(10, 1)})   # (no labels yet)
    later = s.view(2.0, {"feeder-0": a, "feeder-1": b})
    assert later["task_history"] == {"click": [None, 0.80], "buy": [None, 0.71]}
    assert later["task_progressive_history"] == {"click": [None, 0.78], "buy": [None, 0.70]}
    assert len(later["history"]["t"]) == 2
    one = StreamStatus().view(1.0, {"feeder-0": feeder(100, 7)})
    assert one["tasks"] is None and one["feeders"][0]["tasks"] is None
    assert one["task_history"] is None and one["task_progressive_history"] is None
    assert "progressive AUC 0.8000" in stream_line(one, "training").plain


def test_acknowledgements_the_broker_refused_are_counted_and_said():
    """Kafka's commits refused mid-rebalance (and acks that failed): their messages come
    again; the status, Prometheus and the console's line say how many."""
    a, b = feeder(100, 0), feeder(100, 0)
    a["stream"]["acks_refused"] = 3
    b["stream"]["acks_refused"] = "x"   # (a malformed counter: none)
    v = StreamStatus().view(1.0, {"feeder-0": a, "feeder-1": b})
    assert [r["acks_refused"] for r in v["feeders"]] == [3, 0]
    f = Families()
    _stream(f, {"job": "j"}, v)
    assert [s.value for s in f.made["zbus_stream_acks_refused"].samples] == [3, 0]
    assert "3 acks refused" in stream_line(v, "training").plain
