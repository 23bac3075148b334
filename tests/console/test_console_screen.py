"""The console without a job (statuses posted as control publishes them, from the snapshot
tests' captured status): the top line in every phase, the node table's sort marker, slow and
gone nodes, the Cluster tab once the job has ended, a burst of keys typed at once, the command
palette, the notice line. What reaches control is tested against a real control in
test_console.py; the layout as a whole by the snapshots (test_console_snapshots.py)."""

from __future__ import annotations

import asyncio
import copy

from rich.text import Text
from test_console_snapshots import FINAL, SMALL, STATUS, connected
from textual import events
from textual.widgets import Input, Static, TabbedContent

from console import format as fmt
from console.app import ZbusConsole
from console.nodes import NodeTable, cells
from console.settings_screen import SettingsScreen


def typed_at_once(app: ZbusConsole, keys: str) -> None:
    """``keys`` as a terminal delivers a burst: every one queued before any is handled."""
    assert app._driver is not None
    for key in keys:
        event = events.Key(key, key)
        event.set_sender(app)
        app._driver.send_message(event)


async def settings_typed(keys: str, burst: bool) -> str:
    """What the first settings input holds after ``s`` and ``keys``, typed one by one (each
    handled before the next) or in a burst."""
    app = ZbusConsole(None)
    async with app.run_test(size=SMALL) as pilot:
        await connected(pilot, history=1)
        if burst:
            typed_at_once(app, "s" + keys)
        else:
            await pilot.press("s", *keys)
        await pilot.pause()
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)
        assert app.query_one("#tabs", TabbedContent).active == "cluster"  # 4 is a tab's key
        return app.screen.query_one("#set-net_util_max", Input).value


def test_a_burst_of_keys_typed_into_the_settings_loses_none():
    digits = "4321098765" * 3
    one_by_one = asyncio.run(settings_typed(digits, burst=False))
    assert one_by_one.endswith(digits)
    assert asyncio.run(settings_typed(digits, burst=True)) == one_by_one


def test_an_s_typed_into_the_settings_does_not_open_them_again():
    """``s`` is a priority binding (it opens the settings before the keys after it are handed
    on); on the settings screen, a modal one, it opens no second settings screen."""
    async def drive() -> None:
        app = ZbusConsole(None)
        async with app.run_test(size=SMALL) as pilot:
            await connected(pilot, history=1)
            await pilot.press("s", "1", "s", "s")
            await pilot.pause()
            assert isinstance(app.screen, SettingsScreen)
            assert sum(isinstance(s, SettingsScreen) for s in app.screen_stack) == 1

    asyncio.run(drive())


def test_the_palette_has_one_entry_for_the_keys():
    async def drive() -> None:
        app = ZbusConsole(None)
        async with app.run_test(size=SMALL):
            titles = [c.title for c in app.get_system_commands(app.screen)]
            assert "Help: keys" in titles
            assert "Keys" not in titles   # Textual's own keys panel, the same thing again
            assert "Quit" in titles       # Textual's other commands stay

    asyncio.run(drive())


def test_no_status_yet_is_said_until_a_status_arrives():
    async def drive() -> None:
        app = ZbusConsole(None)
        async with app.run_test(size=SMALL) as pilot:
            await pilot.press("s")
            notice = app.query_one("#notice", Static)
            assert "no status from control yet" in str(notice.content)
            await connected(pilot, history=1)
            assert str(notice.content) == ""
            await pilot.press("x")   # another notice is not cleared by a status
            await connected(pilot, history=1)
            assert "press x again" in str(notice.content)

    asyncio.run(drive())


PHASES = [("starting", None), ("preparing", None), ("training", None), ("syncing", None),
          ("evaluating", None), ("exporting", None), ("finishing", None),
          ("done", FINAL),
          ("done", {**FINAL, "status": "failed", "auc": None, "logloss": None,
                    "reason": "ps-1 did not come back within recovery_timeout_s = 120 s"}),
          ("done", {**FINAL, "status": "stopped", "reason": "stopped by zbus-ctl stop"}),
          ("done", {**FINAL, "status": "interrupted", "reason": "SIGTERM"})]


def test_the_top_line_is_one_line_at_80_columns_in_every_phase():
    """Each phase, paused and waiting for a node too: the top line fits its one row (it used
    to wrap, and the screen to jump, in phases evaluating and completed), keeping the phase
    or how the job ended."""
    async def drive() -> None:
        app = ZbusConsole(None)
        async with app.run_test(size=SMALL) as pilot:
            line = app.query_one("#link-line", Static)
            for phase, final in PHASES:
                for paused, waiting in ((False, []), (True, [
                        {"node": "worker-0", "what": "to join",
                         "restart": "zbus-worker --index 0", "waited_s": 3.0,
                         "left_s": 597.0}])):
                    s = copy.deepcopy(STATUS)
                    s.update(phase=phase, final=final, paused=paused, waiting=waiting)
                    await connected(pilot, s, history=1)
                    shown = Text(line.content) if isinstance(line.content, str) \
                        else line.content
                    assert shown.cell_len <= line.content_size.width, shown.plain
                    assert (final["status"] if final else phase) in shown.plain
                    failed = final is not None and final["status"] == "failed"
                    assert line.has_class("down") == failed   # red: a failure only
                    if not final:
                        assert "epoch 12/20" in shown.plain

    asyncio.run(drive())


def test_the_sorted_column_is_marked_with_its_order():
    async def drive() -> None:
        app = ZbusConsole(None)
        async with app.run_test(size=SMALL) as pilot:
            await connected(pilot, history=1)
            await pilot.press("2")
            table = app.query_one(NodeTable)

            def headers() -> list[str]:
                return [str(c.label) for c in table.ordered_columns]

            assert headers()[:2] == ["id ▲", "state"]   # by role: the id names it
            await pilot.press("o")
            assert headers()[:2] == ["id", "state ▲"]
            for _ in range(5):
                await pilot.press("o")
            assert "smp/s ▼" in headers()
            assert [h for h in headers() if h.endswith(("▲", "▼"))] == ["smp/s ▼"]
            assert "samples_per_s ▼" in str(app.query_one("#notice", Static).content)

    asyncio.run(drive())


def row(node: str, role: str, samples: float | None, state: str = "alive") -> dict:
    r = copy.deepcopy(next(n for n in STATUS["nodes"] if n["role"] == role))
    r.update(id=node, samples_per_s=samples, state=state)
    return r


def test_a_worker_under_half_its_peers_median_is_flagged_slow():
    rows = [row("worker-0", "worker", 20_000), row("worker-1", "worker", 19_000),
            row("worker-2", "worker", 9_000), row("worker-3", "worker", 21_000),
            row("worker-4", "worker", 100, state="failed"),   # gone: not a peer, not slow
            row("feeder-0", "feeder", 40_000),                # alone in its role
            row("ps-0", "ps", None), row("ps-1", "ps", None)]
    assert fmt.slow_nodes(rows) == {"worker-2": 19_500}
    pair = [rows[0], row("worker-5", "worker", 5_000)]
    assert fmt.slow_nodes(pair) == {"worker-5": 12_500}   # two suffice
    assert fmt.slow_nodes(rows[:2]) == {}
    shown = cells(rows[2], wide=False, slow=True)
    assert str(shown[6]) == "▼9.0k"


def test_a_gone_node_shows_no_figures_as_live_and_when_it_was_last_heard():
    gone = row("worker-2", "worker", 9_000, state="failed")
    gone["beat_age_s"] = 42.0
    shown = [str(c) for c in cells(gone, wide=True)]
    assert shown[0] == "worker-2"
    assert shown[2:9] == [fmt.DASH] * 7        # cpu .. M: dashes
    assert shown[9] == "42s ago"
    live = [str(c) for c in cells(row("worker-0", "worker", 9_000), wide=True)]
    assert live[6] == "9.0k"


def test_the_cluster_tab_says_how_the_job_ended_not_that_it_runs():
    async def drive() -> None:
        app = ZbusConsole(None)
        async with app.run_test(size=SMALL) as pilot:
            s = copy.deepcopy(STATUS)
            s["cluster"].update(recoveries=3, recovered={"aggregator": 0, "shard": 2,
                                                         "rollback": 1})
            await connected(pilot, s, history=1)
            facts = str(app.query_one("#cluster-facts", Static).content)
            assert "feeding    running" in facts and "alive" in facts
            assert "recoveries 3 (shard 2, rollback 1)" in facts
            s.update(phase="done", final={**FINAL, "status": "failed",
                                          "reason": "ps-1 did not come back"})
            await connected(pilot, s, history=1)
            facts = str(app.query_one("#cluster-facts", Static).content)
            assert "ended      failed" in facts and "ps-1 did not come back" in facts
            assert "feeding    ended (failed)" in facts
            assert "alive" not in facts and "running" not in facts

    asyncio.run(drive())
