"""The console's layout at 80x24 and 160x48, fixed by snapshots (pytest-textual-snapshot):
every tab with its charts, the settings screen and its confirmation, the help, the
no-connection banner, a job that is loading its data, a checkpoint being cut, a job waiting
for a shard to be restarted, a slow worker, the Cluster tab while evaluating and once the job
has completed or failed, and a job that has ended (also once control has exited). The
status is captured from a real lazy job on Adult at epoch 12 of 20
(tests/data/console_status.json; worker-1 marked suspect and worker-2 failed by hand, the
checkpoint figures added by hand); the Nodes tab's history is made of that status
posted 90 times with figures that change with the clock.
After an intended change of layout:
``pytest tests/console/test_console_snapshots.py --snapshot-update``, and look at the new SVGs
before committing them."""

from __future__ import annotations

import asyncio
import copy
import math

import orjson
import pytest
from harness import REPO
from textual.widgets import Input

from console.app import ZbusConsole
from console.bus import LinkChanged, StatusArrived
from console.nodes import NodesPanel
from console.panels import ClusterPanel

STATUS = orjson.loads((REPO / "tests" / "data" / "console_status.json").read_bytes())
# a Zipf job with skew-aware placement, shard 1 slowed 2x, caught while draining for map v26
SKEW_STATUS = orjson.loads((REPO / "tests" / "data" / "console_status_skew.json").read_bytes())
# Adult with one model-parallel group of two processes (jobs/adult_mp.toml), caught training
MP_STATUS = orjson.loads((REPO / "tests" / "data" / "console_status_mp.json").read_bytes())
SMALL, LARGE = (80, 24), (160, 48)
HISTORY = 90


def at(status: dict, second: int) -> dict:
    """The status as control published it ``second`` seconds earlier or later: each node's
    figures drift with the clock, so that its history has a shape."""
    s = copy.deepcopy(status)
    s["uptime_s"] = round(status["uptime_s"]) + HISTORY + second
    for i, n in enumerate(s["nodes"]):
        wave = 1 + 0.5 * math.sin(second / 9 + i)
        for key in ("cpu", "in_per_s", "out_per_s"):
            if n.get(key) is not None:
                n[key] = round(n[key] * wave, 1)
        if n.get("rss") is not None:
            n["rss"] = round(n["rss"] * (1 + 0.1 * (HISTORY + second) / HISTORY))
    return s


@pytest.fixture(autouse=True)
def steady_cursor(monkeypatch):
    """An input's cursor blinks every 0.5 s from when it has the focus: on a busy machine the
    screenshot may come later than that, and catch it hidden. Here it stays shown."""
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)


async def connected(pilot, status: dict = STATUS, history: int = HISTORY) -> None:
    """Connected, ``history`` statuses received. The last three arrive as control's do (the
    Nodes tab draws one of its three charts per status); the earlier ones only go into the
    histories, as each status does first (``ZbusConsole.on_status_arrived``), without drawing
    a screen no snapshot sees (90 drawn screens took most of a snapshot's time)."""
    pilot.app.post_message(LinkChanged(True, "control at tcp://10.0.0.1:47107"))
    seconds = range(-history + 1, 1)
    for second in seconds[:-3]:
        snap = at(status, second)
        pilot.app.query_one(ClusterPanel).record(snap)
        pilot.app.query_one(NodesPanel).record(snap)
    for second in seconds[-3:]:
        pilot.app.post_message(StatusArrived(at(status, second)))
    await pilot.pause()


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "160x48"])
@pytest.mark.parametrize("keys", [(), ("2",), ("2", "down", "down", "down", "down"), ("3",),
                                  ("4",), ("s",), ("question_mark",)],
                         ids=["cluster", "nodes", "nodes-worker-0", "training", "partition",
                              "settings", "help"])
def test_screens(snap_compare, keys, size):
    assert snap_compare(ZbusConsole(None), press=keys, terminal_size=size,
                        run_before=connected)


def test_settings_confirmation(snap_compare):
    async def typed(pilot) -> None:
        await connected(pilot, history=1)
        await pilot.press("s")
        pilot.app.screen.query_one("#set-net_util_max").value = "0.5"
        await pilot.press("ctrl+s")

    assert snap_compare(ZbusConsole(None), terminal_size=SMALL, run_before=typed)


def test_no_connection(snap_compare):
    async def lost(pilot) -> None:
        await connected(pilot, history=1)
        pilot.app.post_message(LinkChanged(False, "no connection: control at "
                                                  "tcp://10.0.0.1:47107 silent for 9 s, "
                                                  "retrying"))
        await pilot.pause()

    assert snap_compare(ZbusConsole(None), terminal_size=SMALL, run_before=lost)


def loading() -> dict:
    s = copy.deepcopy(STATUS)
    s.update(phase="preparing", epoch=-1, round=0)
    s["training"].update(samples_acked=0, epoch_samples=0, samples_per_s=0,
                         eta_epoch_s=None, eta_job_s=None, epochs=[],
                         history={"t": [], "loss": [], "samples_per_s": []})
    s["tasks"] = [{"node": "feeder-0", "task": "statistics of the data", "unit": "rows",
                   "done": 412_000.0, "total": 1_000_000.0, "rate": 61_500.0, "eta_s": 9.6,
                   "elapsed_s": 6.7}]
    return s


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "160x48"])
def test_a_loading_job_shows_a_progress_bar(snap_compare, size):
    async def load(pilot) -> None:
        await connected(pilot, loading(), history=1)

    assert snap_compare(ZbusConsole(None), terminal_size=size, run_before=load)


def test_a_job_waiting_for_a_restart_says_what_to_restart_and_by_when(snap_compare):
    s = copy.deepcopy(STATUS)
    s["waiting"] = [{"node": "ps-1", "what": "to be restarted", "restart": "zbus-ps --index 1",
                     "waited_s": 25.0, "left_s": 95.0}]

    async def wait(pilot) -> None:
        await connected(pilot, s, history=1)

    assert snap_compare(ZbusConsole(None), terminal_size=SMALL, run_before=wait)


FINAL = {"status": "completed", "reason": "", "auc": 0.9071, "logloss": 0.3121,
         "summary": "runs/adult-20261123-101500/summary.json", "wall_s": 41.3,
         "samples_per_s": 61_234.0}


def test_an_ended_job_after_control_exited(snap_compare):
    s = copy.deepcopy(STATUS)
    s.update(phase="done", final=FINAL)

    async def ended(pilot) -> None:
        await connected(pilot, s, history=1)
        pilot.app.post_message(LinkChanged(False, "no connection: control at "
                                                  "tcp://10.0.0.1:47107 silent for 9 s, "
                                                  "retrying"))
        await pilot.pause()

    assert snap_compare(ZbusConsole(None), terminal_size=SMALL, run_before=ended)


def test_a_failed_job(snap_compare):
    s = copy.deepcopy(STATUS)
    s.update(phase="done", final={**FINAL, "status": "failed", "auc": None, "logloss": None,
                                  "reason": "ps-1 did not come back within "
                                            "recovery_timeout_s = 120 s"})

    async def failed(pilot) -> None:
        await connected(pilot, s, history=1)

    assert snap_compare(ZbusConsole(None), terminal_size=SMALL, run_before=failed)


def in_phase(phase: str) -> dict:
    """The captured status in ``phase``: evaluating, or ended as completed or failed."""
    s = copy.deepcopy(STATUS)
    if phase == "evaluating":
        s.update(phase="evaluating")
    elif phase == "completed":
        s.update(phase="done", final=FINAL)
    else:
        s.update(phase="done", final={**FINAL, "status": "failed", "auc": None,
                                      "logloss": None, "reason": "ps-1 did not come back "
                                      "within recovery_timeout_s = 120 s"})
    return s


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "160x48"])
@pytest.mark.parametrize("phase", ["evaluating", "completed", "failed"])
def test_the_cluster_tab_in_a_phase(snap_compare, phase, size):
    """With the charts' history; training is test_screens[cluster-*]."""
    async def run(pilot) -> None:
        await connected(pilot, in_phase(phase))

    assert snap_compare(ZbusConsole(None), terminal_size=size, run_before=run)


def test_a_slow_worker_is_flagged_and_says_why(snap_compare):
    """worker-1 at 5k samples/s beside worker-0's 18.7k (worker-2 failed: not a peer),
    selected: its line says the median it is under half of."""
    s = copy.deepcopy(STATUS)
    next(n for n in s["nodes"] if n["id"] == "worker-1")["samples_per_s"] = 5_000.0

    async def slow(pilot) -> None:
        await connected(pilot, s, history=1)

    assert snap_compare(ZbusConsole(None), press=("2", *["down"] * 5), terminal_size=SMALL,
                        run_before=slow)


def test_a_checkpoint_being_cut_after_a_resume_from_an_older_one(snap_compare):
    s = copy.deepcopy(STATUS)
    s["checkpoint"].update(under_way={"number": 3, "phase": "resume", "elapsed_s": 0.4},
                           next_in_s=None,
                           rollbacks=[{"checkpoint": 1, "round": 9, "epoch": 4, "at_s": 14.2,
                                       "retrained_samples": 18_430}])
    s["tasks"] = [{"node": "control", "task": "checkpoint 3: writing the files",
                   "unit": "parts", "done": 3, "total": 4, "rate": None, "eta_s": None,
                   "elapsed_s": 0.4}]

    async def cutting(pilot) -> None:
        await connected(pilot, s, history=1)

    assert snap_compare(ZbusConsole(None), terminal_size=SMALL, run_before=cutting)


def test_partition_with_skew_aware_placement(snap_compare):
    async def skewed(pilot) -> None:
        await connected(pilot, SKEW_STATUS, history=1)

    assert snap_compare(ZbusConsole(None), press=("4",), terminal_size=SMALL,
                        run_before=skewed)


def test_partition_of_the_model_over_a_group(snap_compare):
    async def grouped(pilot) -> None:
        await connected(pilot, MP_STATUS, history=1)

    assert snap_compare(ZbusConsole(None), press=("4",), terminal_size=SMALL,
                        run_before=grouped)


def test_escape_closes_the_keys_panel():
    async def drive() -> None:
        app = ZbusConsole(None)
        async with app.run_test(size=SMALL) as pilot:
            await connected(pilot, history=1)
            app.action_show_help_panel()
            await pilot.pause()
            assert app.screen.query("HelpPanel")
            await pilot.press("escape")
            await pilot.pause()
            assert not app.screen.query("HelpPanel")

    asyncio.run(drive())


# the Zipf job with admission (min_count 3) and expiry (100 batches), skew-aware placement and
# shard 1 slowed 2x, caught in its third epoch
BOUNDED_STATUS = orjson.loads((REPO / "tests" / "data" / "console_status_bounded.json")
                              .read_bytes())


def test_partition_with_bounded_tables(snap_compare):
    async def bounded(pilot) -> None:
        await connected(pilot, BOUNDED_STATUS)

    assert snap_compare(ZbusConsole(None), press=("4",), terminal_size=SMALL,
                        run_before=bounded)


def streaming(lag_growing: bool, labels: bool = False) -> dict:
    """A stream job of two feeders: the captured status with its stream part made by control's
    own ``StreamStatus`` from 60 statuses of feeder counters (lag, events trained and the
    progressive AUC moving with the clock; the newest window's AUC drifting down and back, as
    after a change in the stream), the lag rising at the end when ``lag_growing``; with
    ``labels``, two labels (click and buy), each with its figures."""
    from roles.algorithms.control.stream_status import StreamStatus

    view = StreamStatus()
    s = copy.deepcopy(STATUS)
    for second in range(60):
        counters = {}
        for i in (0, 1):
            lag = 400 + 50 * i + (40 * (second - 50) if lag_growing and second > 50 else
                                  round(120 * math.sin(second / 7 + i)))
            counters[f"feeder-{i}"] = {"stream": {
                "events_read": 1_200 * second + 40 * i + lag,
                "events_trained": 1_200 * second + 40 * i, "events_rejected": 3 * i,
                "lag_events": lag, "lag_s": round(0.2 + lag / 4_000, 3),
                "progressive_auc": round(0.84 + 0.01 * i + second / 6_000, 4),
                "window_auc": round(0.85 - 0.03 * math.exp(-((second - 30) / 8) ** 2)
                                    - 0.004 * i, 4),
                "broker_down_since": None}}
            if labels:
                window = counters[f"feeder-{i}"]["stream"]["window_auc"]
                counters[f"feeder-{i}"]["stream"]["tasks"] = {
                    "click": {"progressive_auc": 0.84, "window_auc": window},
                    "buy": {"progressive_auc": 0.77, "window_auc": round(window - 0.08, 4)}}
        s["stream"] = view.view(float(second * 2), counters)
    s.update(phase="training", epochs=1, epoch=0)
    return s


@pytest.mark.parametrize(("growing", "labels"), [(False, False), (True, False), (False, True)],
                         ids=["steady", "lag-growing", "two-labels"])
def test_a_stream_jobs_training_tab_shows_its_lag_and_progressive_auc(snap_compare, growing,
                                                                       labels):
    """The stream line (the lag in red while it grows), the lag chart, and the progressive
    AUC chart (the newest window's and every event's) in place of the epochs' table; with two
    labels, each label's progressive AUC in the line and its window AUC in the chart."""
    async def stream(pilot) -> None:
        await connected(pilot, streaming(growing, labels), history=1)
        await pilot.press("3")

    assert snap_compare(ZbusConsole(None), terminal_size=LARGE, run_before=stream)
