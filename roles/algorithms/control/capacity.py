"""The capacity predictor: how many key-value pairs each shard can take in a window.

History records come from the job itself: for each completed allocation window, operation
(``lookup``: finding or creating rows and gathering them; ``update``: the sparse Adagrad step)
and shard, the pairs the shard processed and the seconds it was busy doing so.

Before training, records of one operation whose time per pair is an outlier for their shard
(further than ``OUTLIER_MADS`` scaled median absolute deviations from the median, in log space:
a garbage collection, a page fault storm, a noisy neighbour) are filtered out.

The model is a small MLP: input (one-hot operation, log of the window's total pairs), two
hidden layers, one output per shard, the log of that shard's seconds per pair. A shard's
capacity in a window of P pairs is its share of the cluster's throughput, summed over both
operations:  rate_s = 1 / (t_lookup,s + t_update,s),  capacity_s = P x rate_s / sum(rate).
Before ``min_windows`` windows of history exist, capacities come from the job file (equal by
default).

The records are appended to ``placement/capacity_records.jsonl`` in the run directory as they
come (``append_records``; a line torn by a crash is skipped when read back), and
``CapacityPredictor.save`` replaces ``placement/capacity_model.pt`` atomically after each
training.
"""

from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import orjson

from zbus.files import atomic_write

OPERATIONS = ("lookup", "update")
OUTLIER_MADS = 3.5
MAD_SCALE = 1.4826  # MAD of a normal distribution -> its standard deviation
MODEL_FILE = "capacity_model.pt"
RECORDS_FILE = "capacity_records.jsonl"


@dataclass(frozen=True)
class Record:
    window: int
    op: str
    shard: int
    total_pairs: int     # pairs of the whole window (all shards)
    pairs: int           # pairs this shard processed
    seconds: float       # seconds it was busy with them

    @property
    def log_seconds_per_pair(self) -> float:
        return math.log(self.seconds / self.pairs)


def usable(r: Record) -> bool:
    return r.op in OPERATIONS and r.pairs > 0 and r.seconds > 0 and r.total_pairs > 0


def filter_outliers(records: list[Record]) -> tuple[list[Record], list[Record]]:
    """(kept, dropped): per operation and shard, records whose log time per pair lies more
    than OUTLIER_MADS scaled MADs from the median are dropped (groups under 4 records are
    kept whole: too few to call anything an outlier)."""
    kept, dropped = [], []
    groups: dict[tuple[str, int], list[Record]] = {}
    for r in records:
        if usable(r):
            groups.setdefault((r.op, r.shard), []).append(r)
        else:
            dropped.append(r)
    for group in groups.values():
        x = np.array([r.log_seconds_per_pair for r in group])
        if len(group) < 4:
            kept += group
            continue
        median = np.median(x)
        spread = max(MAD_SCALE * np.median(np.abs(x - median)), 1e-3)
        for r, v in zip(group, x, strict=True):
            (kept if abs(v - median) <= OUTLIER_MADS * spread else dropped).append(r)
    return kept, dropped


def _features(op: str, total_pairs: float) -> list[float]:
    return [float(op == "lookup"), float(op == "update"), math.log1p(total_pairs) / 20.0]


class CapacityPredictor:
    def __init__(self, shards: int, hidden: int = 32, seed: int = 0):
        import torch  # only control imports this module, and only when placement is on

        torch.set_num_threads(1)  # a tiny net: threads cost more than they give (control's loop)
        self.torch = torch
        self.shards = shards
        self.hidden = hidden
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(3, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, shards))
        self.offset = 0.0    # mean log seconds per pair, so the net learns around zero
        self.trained_on = 0  # records in the last training
        self.dropped = 0     # outliers filtered before the last training

    def copy(self) -> CapacityPredictor:
        """An independent predictor with the same weights (trained on while this one serves)."""
        twin = CapacityPredictor(self.shards, self.hidden)
        twin.model.load_state_dict(self.model.state_dict())
        twin.offset, twin.trained_on, twin.dropped = self.offset, self.trained_on, self.dropped
        return twin

    def fit(self, records: list[Record], steps: int = 300, lr: float = 0.02) -> None:
        """Train on the records (outliers filtered), full batch, Adam, MSE on log time/pair.
        A window in which a shard processed nothing gives no target for that shard. Later
        calls start from the weights already learnt and take a fifth of the steps."""
        torch = self.torch
        kept, dropped = filter_outliers(records)
        self.dropped = len(dropped)
        rows: dict[tuple[int, str], tuple[int, dict[int, float]]] = {}
        for r in kept:
            if r.shard < self.shards:
                rows.setdefault((r.window, r.op), (r.total_pairs, {}))[1][r.shard] = \
                    r.log_seconds_per_pair
        if not rows:
            raise ValueError("no usable history records to train on")
        x = torch.tensor([_features(op, total) for (_, op), (total, _) in rows.items()])
        y = torch.zeros((len(rows), self.shards))
        mask = torch.zeros((len(rows), self.shards))
        for i, (_, targets) in enumerate(rows.values()):
            for shard, value in targets.items():
                y[i, shard], mask[i, shard] = value, 1.0
        self.offset = float((y * mask).sum() / mask.sum())
        y = y - self.offset
        # Adam as torch.optim.Adam steps it, without its constructor's import of torch._dynamo
        # (seconds of the trainer's start: roles.algorithms.shared.dense_optimizer)
        from roles.algorithms.shared.dense_optimizer import DenseAdam
        opt = DenseAdam(list(self.model.parameters()), lr)
        for _ in range(steps if not self.trained_on else max(1, steps // 5)):
            opt.zero_grad()
            loss = (((self.model(x) - y) ** 2) * mask).sum() / mask.sum()
            loss.backward()
            opt.step()
        self.trained_on = len(kept)

    def seconds_per_pair(self, op: str, total_pairs: float) -> np.ndarray:
        with self.torch.no_grad():
            out = self.model(self.torch.tensor([_features(op, total_pairs)]))[0]
        seconds: np.ndarray = np.exp(out.numpy().astype(np.float64) + self.offset)
        return seconds

    def capacities(self, total_pairs: float) -> np.ndarray:
        """Pairs each shard can take in a window of ``total_pairs`` (they sum to it)."""
        per_pair = self.seconds_per_pair(OPERATIONS[0], total_pairs)
        for op in OPERATIONS[1:]:
            per_pair = per_pair + self.seconds_per_pair(op, total_pairs)
        rate = 1.0 / per_pair
        capacities: np.ndarray = total_pairs * rate / rate.sum()
        return capacities

    def save(self, where: Path) -> None:
        where.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        self.torch.save({"state": self.model.state_dict(), "offset": self.offset,
                         "shards": self.shards}, buf)
        atomic_write(where / MODEL_FILE, buf.getvalue())

    @classmethod
    def load(cls, where: Path) -> CapacityPredictor:
        import torch

        state = torch.load(where / MODEL_FILE, weights_only=True)
        predictor = cls(int(state["shards"]))
        predictor.model.load_state_dict(state["state"])
        predictor.offset = float(state["offset"])
        predictor.trained_on = 1
        return predictor


def append_records(where: Path, records: list[Record]) -> None:
    where.mkdir(parents=True, exist_ok=True)
    with open(where / RECORDS_FILE, "ab") as f:
        f.write(b"".join(orjson.dumps(asdict(r)) + b"\n" for r in records))


def read_records(where: Path) -> list[Record]:
    out = []
    for line in (where / RECORDS_FILE).read_bytes().splitlines():
        try:
            out.append(Record(**orjson.loads(line)))
        except (orjson.JSONDecodeError, TypeError):
            continue   # a line torn by a crash mid-append
    return out


def equal_or_configured(total_pairs: float, shards: int, configured: list[float]) -> np.ndarray:
    """Capacities before history exists: the job file's relative figures, else equal."""
    weights = np.asarray(configured if configured else [1.0] * shards, dtype=np.float64)
    capacities: np.ndarray = total_pairs * weights / weights.sum()
    return capacities
