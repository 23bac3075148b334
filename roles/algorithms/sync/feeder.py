"""The feeder's side of each sync mode (``roles.algorithms.sync``): in mode ``round`` it
releases a round's batches at a time and reports each round drained; in every other mode it
feeds freely (as fast as its ledger and the sample queue take batches). A strategy also says
what it adds to a checkpoint's position and takes it back on a roll-back to that checkpoint
(mode ``round``: the round being fed). Pure: the feeder sends what a strategy returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from roles.job.settings import Job
from roles.protocol.dense_sync import RoundDrained


class FeederSync(Protocol):
    def round_full(self) -> bool:
        """Every training batch of the round has been sent: new ones wait for the next."""

    def round_of(self, eval: bool) -> int:
        """The sync round a new batch is tagged with (SampleBatch ``round``; 0: none)."""

    def sent(self, eval: bool) -> None:
        """A new batch went out."""

    def acked(self, samples: int) -> None:
        """A training batch of ``samples`` samples was acknowledged."""

    def all_acked(self, eval: bool) -> RoundDrained | None:
        """Nothing is in flight (in a pass of evaluation when ``eval``): the report due to
        control, if any."""

    def position(self) -> dict[str, int]:
        """What the mode adds to the feeder's position in a checkpoint (none by default)."""
        return {}

    def restore(self, position: Mapping[str, Any]) -> None:
        """The whole job went back to a checkpoint at ``position`` (what ``position`` wrote,
        or less from a checkpoint of another mode): take the mode's state back from it."""
        return None  # nothing to take back by default


class FreeFeeding(FeederSync):
    """Modes ``step``, ``every`` and ``lazy``: no rounds in the data path."""

    def round_full(self) -> bool:
        return False

    def round_of(self, eval: bool) -> int:
        return 0

    def sent(self, eval: bool) -> None:
        pass

    def acked(self, samples: int) -> None:
        pass

    def all_acked(self, eval: bool) -> RoundDrained | None:
        return None


class RoundFeeding(FeederSync):
    """Mode ``round``: ``batches`` training batches (``round_iterations`` per worker) make a
    round; the next round's wait until every batch of this one is acknowledged, which is
    reported (RoundDrained) so that control calls the round's aggregation."""

    def __init__(self, batches: int):
        self.per_round = batches
        self.round = 1           # the round being fed
        self.sent_in_round = 0   # its training batches sent
        self.samples = 0         # and the samples acknowledged

    def round_full(self) -> bool:
        return self.sent_in_round >= self.per_round

    def round_of(self, eval: bool) -> int:
        return 0 if eval else self.round

    def sent(self, eval: bool) -> None:
        self.sent_in_round += not eval

    def acked(self, samples: int) -> None:
        self.samples += samples

    def all_acked(self, eval: bool) -> RoundDrained | None:
        if eval or not self.sent_in_round:
            return None
        drained = RoundDrained(round=self.round, samples=self.samples)
        self.round += 1
        self.sent_in_round = self.samples = 0
        return drained

    def position(self) -> dict[str, int]:
        return {"sync_round": self.round}

    def restore(self, position: Mapping[str, Any]) -> None:
        if "sync_round" in position:
            self.round = int(position["sync_round"])


def for_mode(job: Job) -> FeederSync:
    """The feeder's strategy for ``[train] sync``."""
    match job.train.sync:
        case "round":
            return RoundFeeding(job.cluster.workers * job.train.round_iterations)
        case "step" | "every" | "lazy":
            return FreeFeeding()
    raise ValueError(f"unknown sync mode {job.train.sync!r}")
