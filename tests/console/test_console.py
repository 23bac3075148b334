"""The console driven with Pilot against a real control (and real nodes where the screen needs
them), their roles turned in this process, over real sockets on loopback. What control did is
asserted from control (its status, its metrics and summary, or a zbus-ctl request), not from
the widgets."""

from __future__ import annotations

import asyncio
import io
import re
import signal
import socket
import threading
import time

import pytest
from harness import ADULT_JOB
from rich.console import Console

from console.app import ZbusConsole
from console.bus import Endpoints
from console.nodes import NodeTable
from console.screens import ConfirmScreen, HelpScreen
from console.settings_screen import SettingsScreen
from roles.serving.metrics import Recent
from roles.serving.reporting import Reporter
from roles.testbed import sim_nodes
from roles.testbed.in_process import IN_PROCESS
from roles.tools.ctl import request

SIZE = (80, 24)


def endpoints(c) -> Endpoints:
    return Endpoints(c.job.cluster.endpoint("status"), c.job.cluster.endpoint("control_req"))


def notice(pilot) -> str:
    """The console's notice line: an action's answer from control."""
    return str(pilot.app.query_one("#notice").content)


async def until(pilot, predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"console: {what} not within {timeout} s "
                                 f"(link: {pilot.app.link_detail}; notice: {notice(pilot)!r})")
        await pilot.pause(0.1)


def state_cell(app, node_id: str) -> str:
    table = app.query_one(NodeTable)
    return str(table.get_cell(node_id, "state")) if node_id in \
        {r["id"] for r in table.rows_shown} else ""


def control_settings(c) -> dict:
    return request(c.job.cluster.endpoint("control_req"), "settings").settings


@pytest.mark.inprocess
def test_node_table_failed_worker_and_the_actions_reach_control(cluster):
    c = cluster(ADULT_JOB, train__sync="lazy", train__epochs=100, cluster__workers=3,
                cluster__node_timeout_s=2.0, aggregation__min_local_rounds=10_000,
                aggregation__max_local_rounds=10_000)
    c.start_all(slowdown={0: 4.0, 1: 4.0, 2: 4.0})
    nodes = {"feeder-0", "aggregator-0", "ps-0", "ps-1", "worker-0", "worker-1", "worker-2"}

    def events(kind: str) -> list[dict]:
        return [e for e in c.events() if e["event"] == kind]

    async def drive() -> None:
        app = ZbusConsole(endpoints(c))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("2")  # the node table
            await until(pilot, lambda: {r["id"] for r in app.query_one(NodeTable).rows_shown}
                        >= nodes and app.snapshot["phase"] == "training",
                        "every node in the table while training")
            assert all("alive" in state_cell(app, n) for n in nodes)
            c.procs["worker-2"].kill()
            await until(pilot, lambda: "failed" in state_cell(app, "worker-2"),
                        "worker-2 marked failed")
            assert "alive" in state_cell(app, "worker-0")
            # aggregate now: with min_local_rounds out of reach only an operator calls rounds
            rounds = len(events("aggregate"))
            for _ in range(5):  # a round of the mode's own (an epoch's end) may be in flight,
                await until(pilot, lambda: not app.snapshot["round_in_flight"]  # or the epoch
                            and app.snapshot["phase"] == "training",  # evaluated: control
                            "training, no round in flight")    # refuses then, as it should
                await pilot.press("a")
                said = await until(pilot, lambda: (n := notice(pilot)).startswith(
                    "aggregate: ") and "asking" not in n and n, "control's answer")
                if "still in flight" not in said and "not training" not in said:
                    break
            assert said.startswith("aggregate: round "), said
            await until(pilot, lambda: any(
                e["reason"].startswith("aggregate now: asked by console-")
                for e in events("aggregate")[rounds:]), "a round called")
            await pilot.press("p")
            await until(pilot, lambda: events("pause"), "pause reaching control")
            await until(pilot, lambda: any(r["id"] == "feeder-0" and r["doing"] == "paused"
                                           for r in app.snapshot["nodes"]), "feeder paused")
            await pilot.press("p")
            await until(pilot, lambda: events("resume"), "resume reaching control")
            backups = len(events("backup"))
            await pilot.press("b")
            await until(pilot, lambda: len(events("backup")) > backups, "a backup written")
            await pilot.press("x")  # armed only: a single x stops nothing
            await pilot.pause(0.5)
            assert c.procs["control-0"].poll() is None and not events("stop")
            for _ in range(5):  # a second x within 3 s stops it; one later (the console held
                await pilot.press("x")  # up that long, its process busy) arms it again
                if not app.stop_armed_at:
                    break
            await until(pilot, lambda: events("stop"), "stop reaching control")

    asyncio.run(drive())
    assert c.wait(timeout=60) == 0, c.logs()
    s = c.summary()
    assert s["status"] == "stopped" and s["reason"].startswith("stopped by console-"), s
    assert "worker-2" in {e["node"] for e in s["membership"] if e["event"] == "failed"}


@pytest.mark.inprocess
def test_settings_screen_changes_control_and_a_refused_value_changes_nothing(cluster):
    c = cluster(ADULT_JOB, cluster__start_timeout_s=600)
    c.start_role("control")

    async def drive() -> None:
        app = ZbusConsole(endpoints(c))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.snapshot, "a status from control")
            await pilot.press("s")
            screen = await until(pilot, lambda: isinstance(app.screen, SettingsScreen)
                                 and app.screen, "the settings screen")
            first = screen.query_one("#set-net_util_max")
            assert app.focused is first and first.cursor_position == len(first.value)

            async def apply(name: str, text: str) -> str:
                box = screen.query_one(f"#set-{name}")
                box.value = ""
                box.focus()
                await pilot.press(*text)  # no pause between the keys: typed fast
                assert box.value == text
                before = str(screen.query_one("#settings-result").render())
                await pilot.click("#apply")
                confirm = await until(pilot, lambda: isinstance(app.screen, ConfirmScreen)
                                      and app.screen, "the confirmation")
                shown = str(confirm.query_one("#confirm-text").render())
                assert f"{name}: " in shown and f"→ {text}" in shown, shown
                await pilot.press("enter")
                return await until(pilot, lambda: (r := str(screen.query_one(
                    "#settings-result").render())) != before and not r.startswith("sent")
                    and r, f"control's answer to {name} = {text}")

            assert (await apply("net_util_max", "0.55")).startswith("applied: net_util_max")
            assert control_settings(c)["net_util_max"] == 0.55
            assert first.value == "0.55" and first.cursor_position == len("0.55")
            await until(pilot, lambda: "(version 1)" in str(
                screen.query_one("#settings-title").render()), "the version refreshed")
            refused = await apply("net_util_max", "1.5")
            assert refused == "refused: net_util_max must be in [0.001, 1.0], got 1.5"
            assert control_settings(c)["net_util_max"] == 0.55  # nothing changed
            assert str(screen.query_one("#now-net_util_max").render()) == "now 0.55"
            screen.query_one("#set-net_util_max").value = "0.55"
            refused = await apply("min_local_rounds", "20")  # above max_local_rounds 16
            assert refused.startswith("refused: min_local_rounds (20) must be <= "), refused
            assert control_settings(c)["min_local_rounds"] == 4
            # cancelled: nothing is sent
            screen.query_one("#set-min_local_rounds").value = "5"
            await pilot.press("ctrl+s")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "confirmation")
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is screen, "back on the settings")
            assert str(screen.query_one("#settings-result").render()) == "not sent"
            assert control_settings(c)["min_local_rounds"] == 4

    asyncio.run(drive())
    assert c.procs["control-0"].poll() is None  # refusals did not hurt control


@pytest.mark.inprocess
def test_help_lists_every_key_and_the_palette_every_action(cluster):
    c = cluster(ADULT_JOB, cluster__start_timeout_s=600)
    c.start_role("control")

    async def drive() -> None:
        app = ZbusConsole(endpoints(c))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.snapshot, "a status from control")
            await pilot.press("question_mark")
            screen = await until(pilot, lambda: isinstance(app.screen, HelpScreen)
                                 and app.screen, "the help")
            console = Console(width=100, record=True, file=io.StringIO())
            console.print(screen.query_one("#help-text").content)
            shown = console.export_text()
            for binding in app.BINDINGS:
                if binding.action != "hide_help_panel":  # every key, in the bar or not
                    assert f" {binding.key_display or binding.key} " in f" {shown} ".replace(
                        "\n", " "), binding.key
            assert "queue" in shown and "look-ups" in shown
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, HelpScreen), "help closed")
            titles = [cmd.title for cmd in app.get_system_commands(app.screen)]
            for title in ("Aggregate now", "Pause or resume feeding", "Back up now",
                          "Export now", "Checkpoint now", "Stop the job", "Live settings"):
                assert title in titles
            await pilot.press("ctrl+p")  # the palette runs an action by name
            await pilot.press(*"Back up now")
            await pilot.pause(0.5)
            await pilot.press("enter")
            await until(pilot, lambda: "backup: " in str(app.query_one("#notice").render()),
                        "the palette's backup answered")

    asyncio.run(drive())


@pytest.mark.inprocess
def test_console_says_when_control_is_gone_and_reconnects_when_it_is_back(cluster):
    c = cluster(ADULT_JOB, transport="tcp", cluster__start_timeout_s=600)
    first = c.start_role("control")

    async def drive() -> None:
        app = ZbusConsole(endpoints(c))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.connected, "connected")
            first.kill()
            await until(pilot, lambda: not app.connected, "the link reported down")
            line = str(app.query_one("#link-line").render())
            assert "no connection" in line and c.job.cluster.endpoint("status") in line, line
            await pilot.press("b")  # a request with nobody to answer it is refused in time
            await until(pilot, lambda: "no answer from control" in str(
                app.query_one("#notice").render()), "the request timing out", timeout=20)
            again = c.start_role("control", 0, "--resume",  # the killed control's run
                                 name="control-again")
            await until(pilot, lambda: app.connected, "reconnected", timeout=30)
            await until(pilot, lambda: app.snapshot["phase"] == "starting", "a status")
            assert again.poll() is None

    asyncio.run(drive())


@pytest.mark.inprocess
def test_the_table_shows_32_reporting_nodes(cluster):
    c = cluster(ADULT_JOB, cluster__workers=27, cluster__shards=3,
                train__stall_timeout_s=600)
    c.start_role("control")
    stop = threading.Event()   # 31 stand-in nodes on a thread of their own
    sim = threading.Thread(target=sim_nodes.run, args=(c.job,), name="sim-nodes", kwargs={
        "stopped": stop.is_set, "host": socket.gethostname() + IN_PROCESS})
    sim.start()

    async def drive() -> None:
        app = ZbusConsole(endpoints(c))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("2")
            await until(pilot, lambda: len(app.query_one(NodeTable).rows_shown) == 32
                        and app.snapshot["phase"] == "training", "32 rows")
            rows = app.query_one(NodeTable).rows_shown
            assert [r["id"] for r in rows[:5]] == ["feeder-0", "aggregator-0", "ps-0", "ps-1",
                                                    "ps-2"]
            await until(pilot, lambda: all(r["samples_per_s"] for r in app.snapshot["nodes"]
                                           if r["role"] == "worker"), "worker rates")
            await pilot.press("o", "o", "o", "o", "o", "o")  # sort by samples per second
            assert app.query_one(NodeTable).sort_by == "samples_per_s"
            await pilot.pause(0.5)
            speeds = [r["samples_per_s"] for r in app.query_one(NodeTable).rows_shown
                      if r["samples_per_s"] is not None]
            assert speeds == sorted(speeds, reverse=True) and len(speeds) == 28  # and feeder

    try:
        asyncio.run(drive())
        c.procs["control-0"].terminate()   # its Stop: the stand-ins leave, control exits
        assert c.wait(timeout=30) == 128 + signal.SIGTERM
        sim.join(10)
        assert not sim.is_alive()
    finally:
        stop.set()
        sim.join(10)


@pytest.mark.inprocess
def test_a_checkpoint_then_a_shard_restart_waited_for_then_the_end_after_control_exits(
        cluster):
    c = cluster(ADULT_JOB, train__epochs=2, checkpoint__every_s=0.5,
                cluster__node_timeout_s=2.0)
    c.start_all(slowdown={0: 2.0, 1: 2.0})

    def line(app) -> str:
        return str(app.query_one("#link-line").render())

    async def drive() -> None:
        app = ZbusConsole(endpoints(c))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.snapshot and app.snapshot["phase"] == "training",
                        "training")
            await until(pilot, lambda: app.snapshot["checkpoint"]["latest"],
                        "a complete checkpoint")
            await until(pilot, lambda: re.search(r"checkpoint \d+, \S+ ago, \S+, training "
                                                 r"paused", str(app.query_one(
                                                     "#cluster-facts").render())),
                        "the newest checkpoint on the Cluster tab")
            c.procs["ps-1"].kill()
            await until(pilot, lambda: "waiting for ps-1" in line(app), "the wait on top")
            strip = str(app.query_one("#tasks-line").render())
            assert "ps-1 to be restarted: start it with zbus-ps --index 1" in strip, strip
            c.start_role("ps", 1)
            await until(pilot, lambda: not app.snapshot["waiting"], "the shard back")
            await until(pilot, lambda: "completed" in line(app), "the end", timeout=120)
            assert "summary runs/" in line(app) or "summary" in line(app)
            await until(pilot, lambda: "control has exited" in line(app), "control gone",
                        timeout=30)
            assert "no connection" not in line(app)
            assert app.query_one("#link-line").has_class("ended")

    asyncio.run(drive())
    assert c.wait(timeout=60) == 0, c.logs()
    assert c.summary()["status"] == "completed"


@pytest.mark.inprocess
def test_the_cluster_tab_lists_the_serving_processes_and_says_when_one_is_gone(cluster):
    """A serving process's reports (``zbus-serve``'s Reporter, over control's request
    endpoint) reach the console through control's status: its line with the version served
    (none yet: not ready) and its requests, then 'gone' once it stops reporting."""
    c = cluster(ADULT_JOB, train__stall_timeout_s=600)
    c.start_role("control")
    recent, asking = Recent(), threading.Event()

    def requests() -> None:   # a request every 10 ms while the test runs
        while not asking.wait(0.01):
            recent.request(0.002)
            recent.scored(3)

    feeding = threading.Thread(target=requests, daemon=True)
    feeding.start()
    reporter = Reporter(c.job.cluster.endpoint("control_req"), c.job, None, "serve-host:8080/7",
                        "http://serve-host:8080", lambda: None, recent, c.run_dir.name).start()

    def serving_text(app) -> str:
        table = app.query_one("#serving-table")
        return str(table.content) if table.display else ""

    async def drive() -> None:
        app = ZbusConsole(endpoints(c))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("1")   # the Cluster tab
            line = await until(pilot, lambda: next((x for x in serving_text(app).splitlines()
                                                    if "serve-host:8080/7" in x), ""),
                               "the server's line")
            assert "not ready" in line and "gone" not in line, line
            assert any(r["server"] == "serve-host:8080/7" and r["requests_per_s"] > 0
                       for r in app.snapshot["serving"]), app.snapshot["serving"]
            reporter.close()
            gone = await until(pilot, lambda: next((x for x in serving_text(app).splitlines()
                                                    if "gone" in x), ""),
                               "the server listed as gone", timeout=30)
            assert "serve-host:8080/7" in gone

    try:
        asyncio.run(drive())
    finally:
        asking.set()
        feeding.join(5)
        reporter.close()
        c.procs["control-0"].terminate()
        c.wait(timeout=30)
