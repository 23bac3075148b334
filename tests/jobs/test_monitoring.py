"""Prometheus and TensorBoard ([monitoring]): the figures control serves at /metrics, read with
prometheus_client's own parser, and the event files it writes, read with TensorBoard's own
reader; a job asking for events without the tensorboard package is told the pip command."""

from __future__ import annotations

import re
import sys
import time
import urllib.request

import orjson
import pytest
from harness import ADULT_JOB, REPO
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from roles.control.monitoring import MonitoringError, TensorBoardEvents
from roles.control.prometheus import StatusCollector
from zbus.sockets import free_tcp_ports

STATUS = orjson.loads((REPO / "tests" / "data" / "console_status.json").read_bytes())


def parsed(text: str) -> dict[str, list]:
    """Family name -> its samples (name, labels, value)."""
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(samples: list, **labels: str) -> float:
    found = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (labels, samples)
    return found[0]


def test_the_collector_serves_the_status_figures_per_node_and_per_job():
    collector = StatusCollector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    assert parsed(generate_latest(registry).decode()) == {}  # nothing before a status
    collector.latest = STATUS
    m = parsed(generate_latest(registry).decode())
    for node in STATUS["nodes"]:
        up = value(m["zbus_node_up"], node=node["id"], role=node["role"])
        assert up == (0.0 if node["state"] == "failed" else 1.0)
        if node["rss"] is not None:
            assert value(m["zbus_node_memory_bytes"], node=node["id"]) == node["rss"]
    feeder = next(n for n in STATUS["nodes"] if n["id"] == "feeder-0")
    assert value(m["zbus_node_cpu_percent"], node="feeder-0") == feeder["cpu"]
    assert value(m["zbus_node_samples_per_second"], node="feeder-0") == feeder["samples_per_s"]
    assert value(m["zbus_node_bus_bytes_per_second"], node="feeder-0",
                 direction="out") == feeder["out_per_s"]
    assert value(m["zbus_node_bus_bytes"], node="feeder-0", direction="in") == \
        feeder["bytes_in"]
    assert value(m["zbus_epoch"], job="adult") == STATUS["epoch"] + 1
    evaluated = [e for e in STATUS["training"]["epochs"] if e["auc"] is not None]
    assert value(m["zbus_eval_auc"], job="adult") == evaluated[-1]["auc"]
    assert value(m["zbus_rounds"], job="adult") == STATUS["cluster"]["rounds_done"]
    assert value(m["zbus_decisions"], decision="aggregate") == \
        STATUS["cluster"]["decisions"]["aggregate"]
    assert value(m["zbus_backups"], job="adult") == STATUS["cluster"]["backups"]
    assert value(m["zbus_job_phase"], phase="training") == 1.0
    assert value(m["zbus_job_phase"], phase="done") == 0.0
    assert value(m["zbus_shard_keys"], shard="0") == \
        STATUS["partition"]["embeddings"]["shards"][0]["keys"]
    assert "zbus_train_loss" in m and "zbus_samples_per_second" in m
    latest = STATUS["checkpoint"]["latest"]
    assert value(m["zbus_checkpoint_latest"], job="adult") == latest["number"]
    assert value(m["zbus_checkpoint_bytes"], job="adult") == latest["bytes"]
    assert value(m["zbus_checkpoint_age_seconds"], job="adult") == latest["age_s"]
    assert value(m["zbus_checkpoint_in_progress"], job="adult") == 0.0


def test_tensorboard_asked_for_without_the_package_names_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    with pytest.raises(MonitoringError, match=r"pip install 'zbus\[tensorboard\]'"):
        TensorBoardEvents(tmp_path / "tensorboard")


def scrape(port: int) -> dict[str, list] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return parsed(r.read().decode())
    except OSError:
        return None


@pytest.mark.inprocess
def test_a_job_serves_prometheus_metrics_and_writes_tensorboard_events(cluster):
    (port,) = free_tcp_ports(1)
    # long enough to be scraped while it trains after its first evaluation (5 epochs, slowed)
    c = cluster(ADULT_JOB, train__sync="lazy", train__epochs=5,
                aggregation__min_local_rounds=2, monitoring__prometheus_port=port,
                monitoring__tensorboard=True, checkpoint__every_s=1.0)
    c.start_all(slowdown={0: 3.0, 1: 3.0})
    seen: dict[str, list] = {}
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and c.procs["control-0"].poll() is None:
        m = scrape(port)
        # the figures of a moment: training (samples per second), and the shards' load share
        # (keys served since their previous heartbeats: none across an epoch's end, at times)
        if m and "zbus_eval_auc" in m and "zbus_train_loss" in m and any(s.value > 0 for s in
                                              m.get("zbus_node_samples_per_second", [])) \
                and "zbus_shard_load_share" in m:
            seen = m
            break
        time.sleep(0.2)
    assert seen, c.logs()
    for family in ("zbus_node_up", "zbus_node_cpu_percent", "zbus_node_memory_bytes",
                   "zbus_node_bus_bytes", "zbus_node_bus_bytes_per_second",
                   "zbus_node_samples_per_second", "zbus_epoch", "zbus_train_loss",
                   "zbus_eval_auc", "zbus_rounds", "zbus_decisions", "zbus_backups",
                   "zbus_shard_keys", "zbus_shard_load_share", "zbus_job_info"):
        assert family in seen, family
    nodes = {s.labels["node"] for s in seen["zbus_node_up"]}
    assert nodes == {"feeder-0", "aggregator-0", "ps-0", "ps-1", "worker-0", "worker-1"}
    assert all(s.value == 1.0 for s in seen["zbus_node_up"])
    assert 0.5 < value(seen["zbus_eval_auc"], job="adult") <= 1.0
    assert c.wait(timeout=240) == 0, c.logs()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(c.run_dir / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    for tag in ("train/loss", "train/samples_per_s", "eval/auc", "eval/logloss",
                "decisions/aggregate", "decisions/wait"):
        assert tag in tags, tags
    summary = c.summary()
    auc = [(e.step, e.value) for e in events.Scalars("eval/auc")]
    assert [step for step, _ in auc] == [1, 2, 3, 4, 5]
    assert auc[-1][1] == pytest.approx(summary["auc"], abs=1e-6)
    assert events.Scalars("decisions/aggregate")[-1].value == \
        summary["aggregation_decisions"]["aggregate"]


def test_every_figure_the_shipped_grafana_dashboard_charts_is_served():
    dashboard = orjson.loads((REPO / "docs" / "grafana-dashboard.json").read_bytes())
    wanted = {name for panel in dashboard["panels"] for target in panel["targets"]
              for name in re.findall(r"zbus_\w+", target["expr"])}
    skew = orjson.loads((REPO / "tests" / "data" / "console_status_skew.json").read_bytes())
    busy = {**STATUS,
            "tasks": [{"node": "feeder-0", "task": "indexing the data", "unit": "bytes",
                       "done": 1.0, "total": 4.0, "rate": 1.0, "eta_s": 3.0}],
            "waiting": [{"node": "ps-1", "what": "to be restarted", "left_s": 90.0}]}
    served = set()
    for status in (STATUS, busy, skew):
        collector = StatusCollector()
        collector.latest = status
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        served |= {s.name for samples in parsed(generate_latest(registry).decode()).values()
                   for s in samples}
    assert wanted and wanted <= served, wanted - served
