"""A feeder's part in a whole-job checkpoint (``roles.feeder.hold.CheckpointHold``), its
collaborators stood in for where they only answer a question (the ledger: nothing in flight;
the passes: the epoch), its ack log and store real."""

from __future__ import annotations

import time
from types import SimpleNamespace

import orjson

from roles.algorithms.feeding.ack_log import AckLog
from roles.algorithms.sync.feeder import FreeFeeding
from roles.feeder.hold import CheckpointHold
from roles.protocol.checkpoint import Checkpoint, Snapshotted
from roles.storage.store import Store

TRANSFORM = {"dense": ["a"], "log1p": False, "mean": [0.5], "std": [2.0]}


class Loading:
    """Control's statistics in (``prepared``) or not yet."""

    def __init__(self) -> None:
        self.transform: dict | None = None

    def prepared(self) -> bool:
        return self.transform is not None

    def transform_json(self) -> dict | None:
        return self.transform


def test_feeder_0_takes_no_part_before_it_has_the_dense_transform(tmp_path):
    """A resumed run's checkpoint asked at once reached feeder 0 before control's statistics:
    its part went without ``transform.json``, the checkpoint was complete and could not be
    scored (a fresh clone's CI: "No such file ... transform.json"). Feeder 0 now answers the
    standing ``write`` once it has the transform; the part then holds it."""
    reports: list = []
    loading = Loading()
    ledger = SimpleNamespace(in_flight=lambda: False,
                             log=lambda: AckLog(tmp_path / "feeders", "feeder-0"))
    hold = CheckpointHold(0, FreeFeeding(), loading, SimpleNamespace(epoch=1), ledger,
                          reports.append, lambda: None)
    hold.open(Store(str(tmp_path / "checkpoints")), "feeder-0")
    write = Checkpoint(number=3, phase="write", round=5, dir=str(tmp_path / "checkpoints"))
    hold.handle(write)
    assert reports == [] and hold.files().writing is None   # not before the statistics
    loading.transform = TRANSFORM
    hold.handle(write)                                       # the standing command's repeat
    assert [type(r) for r in reports] == [Snapshotted] and reports[0].number == 3
    for _ in range(1000):
        if (part := hold.poll()) is not None:
            break
        time.sleep(0.01)
    else:
        raise AssertionError("the part was not written within 10 s")
    assert part.ok and "000003/transform.json" in part.files, part
    assert orjson.loads((tmp_path / "checkpoints" / "000003" / "transform.json")
                        .read_bytes()) == TRANSFORM


def test_the_other_feeders_take_their_part_without_it(tmp_path):
    reports: list = []
    ledger = SimpleNamespace(in_flight=lambda: False,
                             log=lambda: AckLog(tmp_path / "feeders", "feeder-1"))
    hold = CheckpointHold(1, FreeFeeding(), Loading(), SimpleNamespace(epoch=1), ledger,
                          reports.append, lambda: None)
    hold.open(Store(str(tmp_path / "checkpoints")), "feeder-1")
    hold.handle(Checkpoint(number=1, phase="write", round=0, dir=str(tmp_path)))
    assert [type(r) for r in reports] == [Snapshotted]
