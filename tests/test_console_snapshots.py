"""The console's layout at 80x24, fixed by snapshots (pytest-textual-snapshot): every tab, the
settings screen and the no-connection banner, showing a status captured from a real lazy job
(tests/data/console_status.json; worker-1 marked suspect and worker-2 failed by hand).
After an intended change of layout: ``pytest tests/test_console_snapshots.py --snapshot-update``
and look at the new SVGs before committing them."""

from __future__ import annotations

import orjson
import pytest
from harness import REPO

from console.app import ZbusConsole
from console.bus import LinkChanged, StatusArrived

STATUS = orjson.loads((REPO / "tests" / "data" / "console_status.json").read_bytes())
# a Zipf job with skew-aware placement, shard 1 slowed 2x, caught while draining for map v26
SKEW_STATUS = orjson.loads((REPO / "tests" / "data" / "console_status_skew.json").read_bytes())
SIZE = (80, 24)


async def connected(pilot, status: dict = STATUS) -> None:
    pilot.app.post_message(LinkChanged(True, "control at tcp://10.0.0.1:47107"))
    pilot.app.post_message(StatusArrived(status))
    await pilot.pause()


@pytest.mark.parametrize("keys", [(), ("2",), ("3",), ("4",), ("s",)],
                         ids=["cluster", "nodes", "training", "partition", "settings"])
def test_screens(snap_compare, keys):
    assert snap_compare(ZbusConsole(None), press=keys, terminal_size=SIZE,
                        run_before=connected)


def test_no_connection(snap_compare):
    async def lost(pilot) -> None:
        await connected(pilot)
        pilot.app.post_message(LinkChanged(False, "no connection: control at "
                                                  "tcp://10.0.0.1:47107 silent for 9 s, "
                                                  "retrying"))
        await pilot.pause()

    assert snap_compare(ZbusConsole(None), terminal_size=SIZE, run_before=lost)


def test_partition_with_skew_aware_placement(snap_compare):
    async def skewed(pilot) -> None:
        await connected(pilot, SKEW_STATUS)

    assert snap_compare(ZbusConsole(None), press=("4",), terminal_size=SIZE,
                        run_before=skewed)


# Adult with one model-parallel group of two processes (jobs/adult_mp.toml), caught training
MP_STATUS = orjson.loads((REPO / "tests" / "data" / "console_status_mp.json").read_bytes())


def test_partition_of_the_model_over_a_group(snap_compare):
    async def grouped(pilot) -> None:
        await connected(pilot, MP_STATUS)

    assert snap_compare(ZbusConsole(None), press=("4",), terminal_size=SIZE,
                        run_before=grouped)


# the Zipf job with admission (min_count 3) and expiry (100 batches), skew-aware placement and
# shard 1 slowed 2x, caught in its third epoch
BOUNDED_STATUS = orjson.loads((REPO / "tests" / "data" / "console_status_bounded.json")
                              .read_bytes())


def test_partition_with_bounded_tables(snap_compare):
    async def bounded(pilot) -> None:
        await connected(pilot, BOUNDED_STATUS)

    assert snap_compare(ZbusConsole(None), press=("4",), terminal_size=SIZE,
                        run_before=bounded)
