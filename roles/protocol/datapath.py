"""The data path: which feeder feeds which slice (SliceMap), a batch's sparse keys to the shards
(feeder -> ps), its dense part to the sample queue (feeder PUSH -> worker PULL), embeddings and
their gradients (worker <-> ps), and the ledger's take/grant/ack (worker <-> feeder)."""

from __future__ import annotations

from typing import Any

import numpy as np

from roles.protocol.topology import MAX_FEEDERS
from zbus.codec import Message, array, finite, message, require

# A batch id is unique across the whole job: ``epoch << 40 | slice << 32 | seq``, where slice is
# a slice of the data (control's SliceMap); training batches have seqs 0.., eval batches
# EVAL_SEQ.. . It stays below 2**53, so any JSON reader holds it exactly.
MAX_EPOCHS = 1 << 12
MAX_SLICES = 1 << 8
EVAL_SEQ = 1 << 31     # the first eval batch's seq


def make_batch_id(epoch: int, slice_: int, seq: int) -> int:
    if not (0 <= epoch < MAX_EPOCHS and 0 <= slice_ < MAX_SLICES and 0 <= seq < 1 << 32):
        raise ValueError(f"batch id out of range: epoch {epoch}, slice {slice_}, seq {seq}")
    return epoch << 40 | slice_ << 32 | seq


def split_batch_id(batch_id: int) -> tuple[int, int, int]:
    """(epoch, slice, seq) of a batch id."""
    return batch_id >> 40, (batch_id >> 32) & 0xFF, batch_id & 0xFFFFFFFF


@message()
class SliceMap(Message):
    """Control's assignment of the data to the feeders (standing): slice i is the training
    rows ``train[i]`` = [lo, hi) and the eval rows ``eval[i]`` (offsets into each split), fed
    by feeder ``owners[i]``. ``version`` rises when a slice changes hands; ``resume`` then
    says, per slice handed over (by its number as text), where its lost feeder had got to in
    the training pass of ``epoch``: the seqs of the batches acknowledged, their samples and
    loss, and whether that feeder had reported the pass."""

    version: int
    train: list[list[int]]
    eval: list[list[int]]
    owners: list[int]
    resume: dict[str, Any]

    def check(self) -> None:
        n = len(self.owners)
        require(n > 0 and len(self.train) == n and len(self.eval) == n,
                "train, eval and owners must be non-empty and equally long")
        for ranges in (self.train, self.eval):
            require(all(isinstance(r, list) and len(r) == 2
                        and all(isinstance(x, int) and not isinstance(x, bool) for x in r)
                        and 0 <= r[0] <= r[1] for r in ranges), "ranges must be [lo, hi]")
        require(n <= MAX_SLICES and all(0 <= o < MAX_FEEDERS for o in self.owners),
                "owners must be feeder indexes")
        for key, r in self.resume.items():
            require(key.isdigit() and int(key) < n and isinstance(r, dict)
                    and isinstance(r.get("epoch"), int) and isinstance(r.get("low"), int)
                    and isinstance(r.get("above"), list)
                    and all(isinstance(a, int) and a >= 0 for a in r["above"])
                    and all(isinstance(r.get(k), (int, float)) and not isinstance(r[k], bool)
                            for k in ("samples", "loss_sum", "weight_sum")),
                    "resume must map slices to epoch, low, above, samples, loss_sum, "
                    "weight_sum")


@message()
class FeederProgress(Message):
    """How far a feeder's training pass of ``epoch`` has got on each slice it feeds, sent to
    control with every heartbeat (control hands a lost feeder's slices on from here, see
    SliceMap's ``resume``): on slice ``slices[i]`` every batch number below ``low[i]`` and
    those in ``above[i]`` are acknowledged, with ``samples[i]`` samples and loss and weight
    sums ``loss_sum[i]`` / ``weight_sum[i]``; ``batches_acked`` counts every batch the feeder
    has had acknowledged in the job (control's sign that training moves on)."""

    epoch: int
    batches_acked: int
    slices: list[int]
    low: list[int]
    above: list[list[int]]
    samples: list[int]
    loss_sum: list[float]
    weight_sum: list[float]

    def check(self) -> None:
        n = len(self.slices)
        require(all(len(x) == n for x in (self.low, self.above, self.samples, self.loss_sum,
                                            self.weight_sum)), "per-slice lists differ in length")
        require(all(0 <= s < MAX_SLICES for s in self.slices) and len(set(self.slices)) == n,
                "slices must be distinct slice numbers")
        require(self.batches_acked >= 0 and all(x >= 0 for x in (*self.low, *self.samples)),
                "negative counts")
        require(all(isinstance(a, int) and not isinstance(a, bool) and a >= low
                    for low, above in zip(self.low, self.above, strict=True) for a in above),
                "above must list batch numbers at or above low")

    def of(self, slice_: int) -> dict[str, Any] | None:
        """The slice's progress as SliceMap's ``resume`` carries it (None: not fed here)."""
        if slice_ not in self.slices:
            return None
        i = self.slices.index(slice_)
        return {"epoch": self.epoch, "low": self.low[i], "above": list(self.above[i]),
                "samples": self.samples[i], "loss_sum": self.loss_sum[i],
                "weight_sum": self.weight_sum[i]}


@message("keys")
class BatchKeys(Message):
    """The sparse keys of one batch that this shard owns. ``positions`` index the batch's
    flattened (sample, field) grid; ``keys`` are the 64-bit ids at those positions; ``window``
    is the feeder's allocation window the batch belongs to (the shard's load records)."""

    batch_id: int
    window: int
    samples: int
    fields: int
    positions: np.ndarray = array("int32", 1)
    keys: np.ndarray = array("int64", 1)

    def check(self) -> None:
        require(self.positions.shape == self.keys.shape, "positions and keys differ in length")
        grid = self.samples * self.fields
        require(self.samples >= 0 and self.fields > 0, "samples/fields out of range")
        require(not self.positions.size
                or (self.positions.min() >= 0 and self.positions.max() < grid),
                "position outside the batch")
        require(self.positions.size < 2 or bool((np.diff(self.positions) > 0).all()),
                "positions not ascending")


@message("lookups")
class Lookup(Message):
    """A worker asks a shard for the embeddings of a batch; ``train`` false for evaluation
    (no gradients will follow)."""

    batch_id: int
    train: bool


@message("embeddings")
class Embeddings(Message):
    """The shard's rows for a batch. ``mask``: one bit per position of the batch's flattened
    (sample, field) grid of ``grid`` positions (``np.packbits`` order), set where the key is
    this shard's; ``rows[inverse[i]]`` is the embedding at the i-th set position. (A bit per
    position instead of an int32 position per key: the worker's input carries about 4 bytes
    per key occurrence, not 8, and no key.)"""

    batch_id: int
    grid: int
    mask: np.ndarray = array("uint8", 1)
    inverse: np.ndarray = array("int32", 1)
    rows: np.ndarray = array("float32", 2)

    def check(self) -> None:
        require(self.grid >= 0 and self.mask.shape == ((self.grid + 7) // 8,),
                "mask does not fit the grid")
        require(int(np.unpackbits(self.mask).sum()) == len(self.inverse)
                and not (self.grid % 8 and self.mask.size
                         and self.mask[-1] & (0xFF >> (self.grid % 8))),
                "mask and inverse differ")
        require(not self.inverse.size
                or (self.inverse.min() >= 0 and self.inverse.max() < self.rows.shape[0]),
                "inverse index outside rows")

    def positions(self) -> np.ndarray:
        """The grid positions of the set bits, in order."""
        return np.flatnonzero(np.unpackbits(self.mask, count=self.grid))

    @staticmethod
    def mask_of(positions: np.ndarray, grid: int) -> np.ndarray:
        bits = np.zeros(grid, dtype=bool)
        bits[positions] = True
        return np.packbits(bits)


@message("embedding_grads")
class EmbeddingGrads(Message):
    """Gradient of the loss for each row the shard sent for the batch (same order)."""

    batch_id: int
    grads: np.ndarray = array("float32", 2)


@message("samples")
class SampleBatch(Message):
    """Dense features, labels and sample weights of one batch. No sparse keys: the worker gets
    the batch's embeddings from the shards by ``batch_id``. Evaluation batches (``eval``) must be
    scored with weights of round ``min_round`` or later."""

    batch_id: int
    epoch: int
    eval: bool
    min_round: int
    round: int  # sync mode round: the round the batch belongs to (0 in other modes)
    dense: np.ndarray = array("float32", 2)
    labels: np.ndarray = array("float32", 1)
    weights: np.ndarray = array("float32", 1)

    def check(self) -> None:
        n = self.dense.shape[0]
        require(self.labels.shape == (n,) and self.weights.shape == (n,),
                "dense, labels and weights differ in length")
        require(finite(self.dense) and finite(self.weights),
                "non-finite features or weights")


@message("acks")
class Taken(Message):
    """A worker pulled the batch and asks to train it."""

    batch_id: int


@message("acks")
class Idle(Message):
    """A worker has nothing to train and nothing pulled: at the end of a pass the feeder sends
    it copies of batches that sit untaken elsewhere."""


@message("acks")
class Holding(Message):
    """A worker's answer to FeederBack, after its acks: the batches of that feeder granted to
    it and not yet acknowledged. Until every worker has answered, the restarted feeder grants
    and sends nothing, so that no batch granted by its dead process goes to a second worker."""

    held: np.ndarray = array("int64", 1)


@message("acks")
class Grant(Message):
    """The feeder's answer to Taken. Each batch is granted to one worker only: after a worker
    dies its batches are sent again, and a copy another worker already holds is refused."""

    batch_id: int
    granted: bool


@message("acks")
class Ack(Message):
    """A worker finished a batch: training batches carry the loss, eval batches the scores."""

    batch_id: int
    samples: int
    loss_sum: float
    weight_sum: float
    preds: np.ndarray = array("float32", 1)
