"""The data path: what the data is and which feeder reads which part of it (DataIndex, PartMap,
PartStats, DataStats), a feeder's progress, a batch's sparse keys to the shards (feeder -> ps),
its dense part to the sample queue (feeder PUSH -> worker PULL), embeddings and their gradients
(worker <-> ps; in mode ``push`` the feeder tells the shards where to send them: Deliver), and
the ledger's take/grant/ack (worker <-> feeder)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from roles.protocol.topology import MAX_FEEDERS
from zbus.codec import Message, ProtocolError, array, finite, message, require

# A batch id is unique across the whole job: ``epoch << 51 | part << 27 | seq``, where part is
# a part of the data (control's PartMap) and seq the batch's number in the part's pass; a
# pass's batch ids are the same whichever feeder makes them (roles.data.stream). A stream's
# pass never ends: its feeder numbers its batches on past 2^27 (about 8 days at 50,000
# events/s in batches of 256), and those ids carry the seq's high bits in the part field,
# above a flag (``LONG``): ``epoch << 51 | (LONG | seq >> 27 << 4 | part) << 27 | seq % 2^27``
# for a part below 16 (a stream's part is its feeder's index) and a seq below 2^46 (11,000
# years at that rate). Every id of a seq below 2^27 is as it always was.
MAX_EPOCHS = 1 << 12
MAX_FIELDS = 1 << 12  # sparse fields of a job
MAX_PARTS = 1 << 23   # (the part field's top bit is LONG's)
MAX_SEQ = 1 << 27
LONG = 1 << 23
LONG_PART_BITS = 4
MAX_LONG_SEQ = 1 << (27 + 23 - LONG_PART_BITS)
PART_FIELDS = 7   # a part as integers: number, file, first row, rows, start, end, eval
assert MAX_FEEDERS <= 1 << LONG_PART_BITS   # (a stream's part is its feeder's index)


def make_batch_id(epoch: int, part: int, seq: int) -> int:
    if seq >= MAX_SEQ and 0 <= epoch < MAX_EPOCHS and 0 <= part < 1 << LONG_PART_BITS \
            and seq < MAX_LONG_SEQ:
        return epoch << 51 | (LONG | (seq >> 27) << LONG_PART_BITS | part) << 27 | \
            seq & (MAX_SEQ - 1)
    if not (0 <= epoch < MAX_EPOCHS and 0 <= part < MAX_PARTS and 0 <= seq < MAX_SEQ):
        raise ValueError(f"batch id out of range: epoch {epoch}, part {part}, seq {seq}")
    return epoch << 51 | part << 27 | seq


def split_batch_id(batch_id: int) -> tuple[int, int, int]:
    """(epoch, part, seq) of a batch id."""
    field, low = (batch_id >> 27) & (2 * LONG - 1), batch_id & (MAX_SEQ - 1)
    if field & LONG:
        return (batch_id >> 51, field & ((1 << LONG_PART_BITS) - 1),
                (field & (LONG - 1)) >> LONG_PART_BITS << 27 | low)
    return batch_id >> 51, field, low


def make_batch_ids(epoch: int, part: int, seqs: np.ndarray) -> np.ndarray:
    """``make_batch_id`` of each of ``seqs`` (int64)."""
    seqs = np.asarray(seqs, np.int64)
    if not len(seqs):
        return seqs
    make_batch_id(epoch, part, int(seqs.min()))   # (the range checks, at both ends)
    make_batch_id(epoch, part, int(seqs.max()))
    long = (LONG | (seqs >> 27) << LONG_PART_BITS | part) << 27 | seqs & (MAX_SEQ - 1)
    return np.int64(epoch) << 51 | np.where(seqs < MAX_SEQ, part << 27 | seqs, long)


def split_batch_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``split_batch_id`` of each of ``ids`` (int64): epochs, parts, seqs."""
    ids = np.asarray(ids, np.int64)
    field, low = (ids >> 27) & (2 * LONG - 1), ids & (MAX_SEQ - 1)
    long = (field & LONG) != 0
    parts = np.where(long, field & ((1 << LONG_PART_BITS) - 1), field)
    seqs = np.where(long, ((field & (LONG - 1)) >> LONG_PART_BITS) << 27 | low, low)
    return ids >> 51, parts, seqs


# Flow control, shared by the feeder (its ledger's bound, its sample queue's buffers) and the
# worker (the acks it keeps per feeder, its sample queue's buffers).
MAX_TASKS = 64   # labels per sample ([data] labels)


def sample_batch_bytes(batch_size: int, dense: int, lists: int = 0, tasks: int = 1) -> int:
    """About the size of one SampleBatch on the wire: the sample queue's kernel buffers are
    sized to it, so that a worker cannot hold more than a batch or two it has not pulled."""
    return batch_size * (dense + 1 + tasks + lists) * 4 + 1024


def max_in_flight(workers: int, prefetch: int) -> int:
    """A feeder's bound on the batches unacknowledged at a time. Per worker, its prefetch and the
    one it trains, as many again that a slow worker may hold in socket buffers, and some in
    transit. It also bounds the acks a dead feeder can have lost in transit, so a worker
    keeps that many of its latest acks per feeder to send a restarted one again."""
    return max(1, workers) * (2 * prefetch + 6) + 2


def _json_body(body: np.ndarray, what: str) -> Any:
    try:
        return orjson.loads(body.tobytes())
    except orjson.JSONDecodeError:
        raise ProtocolError("bad_body", f"{what} is not JSON") from None


def _body(value: Any) -> np.ndarray:
    return np.frombuffer(orjson.dumps(value), dtype=np.uint8)


def _check_parts(parts: np.ndarray) -> None:
    require(parts.shape[1:] == (PART_FIELDS,), f"parts must be n x {PART_FIELDS} integers")
    if len(parts):
        require(bool((parts[:, 0] == np.arange(len(parts))).all()), "parts out of order")
        require(bool((parts[:, 1:4] >= 0).all() and (parts[:, 4] <= parts[:, 5]).all()),
                "negative rows or a part that ends before it starts")
        require(len(parts) <= MAX_PARTS, "too many parts")


@message()
class DataIndex(Message):
    """Feeder 0's index of the data: the files (``body``, JSON: one object per file, as
    ``roles.data.index.FileIndex``), the parts they are cut into (``parts``: one row of
    PART_FIELDS integers per part), the training rows, and the oracle AUC of synthetic data,
    one per label (none for other data; -1 where the eval rows hold one class)."""

    n_train: int
    oracle_aucs: list[float]
    body: np.ndarray = array("uint8", 1)
    parts: np.ndarray = array("int64", 2)

    def check(self) -> None:
        _check_parts(self.parts)

    def files(self) -> list[dict[str, Any]]:
        files = _json_body(self.body, "DataIndex body")
        if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
            raise ProtocolError("bad_body", "DataIndex body is not a list of files")
        return files


@message()
class PartMap(Message):
    """Control's assignment of the data's parts to the feeders (standing): part i (row i of
    ``parts``, of the files in ``body``) is read by feeder ``owners[i]``. ``version`` rises
    when a part changes hands; ``resume`` then says, per part handed over (by its number as
    text), where its lost feeder had got to in the training pass of ``epoch``: the batches
    acknowledged (every number below ``low``, and those in ``above``), their samples and loss,
    and whether that feeder had reported the pass."""

    version: int
    n_train: int
    resume: dict[str, Any]
    body: np.ndarray = array("uint8", 1)
    parts: np.ndarray = array("int64", 2)
    owners: np.ndarray = array("int32", 1)

    def check(self) -> None:
        _check_parts(self.parts)
        require(self.owners.shape == (len(self.parts),), "one owner per part")
        require(not self.owners.size or (0 <= self.owners.min()
                                         and self.owners.max() < MAX_FEEDERS),
                "owners must be feeder indexes")
        for key, r in self.resume.items():
            require(key.isdigit() and int(key) < len(self.parts) and isinstance(r, dict)
                    and isinstance(r.get("epoch"), int) and isinstance(r.get("low"), int)
                    and isinstance(r.get("above"), list)
                    and all(isinstance(a, int) and a >= 0 for a in r["above"])
                    and all(isinstance(r.get(k), (int, float)) and not isinstance(r[k], bool)
                            for k in ("samples", "loss_sum", "weight_sum")),
                    "resume must map parts to epoch, low, above, samples, loss_sum, "
                    "weight_sum")

    def files(self) -> list[dict[str, Any]]:
        files = _json_body(self.body, "PartMap body")
        if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
            raise ProtocolError("bad_body", "PartMap body is not a list of files")
        return files

    def owner_of(self, part: int) -> int:
        return int(self.owners[part]) if 0 <= part < len(self.owners) else -1

    @staticmethod
    def body_of(files: list[dict[str, Any]]) -> np.ndarray:
        return _body(files)


@message()
class PartStats(Message):
    """A feeder's statistics of training parts (``roles.data.stats``), one row per part:
    ``counts`` = rows read, rows accepted, rows rejected, whole part read (0/1), newest
    timestamp (or -1 with none); ``moments`` = per dense column its count, mean and sum of
    squared deviations (after log1p), as [parts, 3, dense]; ``first_rejected``: the first
    rejected row as "file:line: reason" ('' when none)."""

    first_rejected: str
    parts: np.ndarray = array("int64", 1)
    counts: np.ndarray = array("int64", 2)
    moments: np.ndarray = array("float64", 3)

    def check(self) -> None:
        n = len(self.parts)
        require(self.counts.shape == (n, 5), "counts must be parts x 5")
        require(self.moments.shape[:2] == (n, 3), "moments must be parts x 3 x dense")
        require(not n or bool((self.parts >= 0).all() and (self.counts[:, :3] >= 0).all()),
                "negative part or count")
        require(finite(self.moments), "non-finite moments")


@message()
class DataStats(Message):
    """Control's statistics of the training data (standing; every feeder transforms with them):
    each dense column's mean and standard deviation (after log1p when ``log1p``), the newest
    timestamp (-1 with none), and the rows read and rejected by the statistics pass."""

    log1p: bool
    newest: int
    rows_read: int
    rejected: int
    mean: np.ndarray = array("float64", 1)
    std: np.ndarray = array("float64", 1)

    def check(self) -> None:
        require(self.mean.shape == self.std.shape, "mean and std differ in length")
        require(finite(self.mean) and finite(self.std) and bool((self.std > 0).all()),
                "mean and std must be finite, std positive")


@message()
class FeederProgress(Message):
    """How far a feeder's training pass of ``epoch`` has got on each part it reads, sent to
    control with every heartbeat (control hands a lost feeder's parts on from here, see
    PartMap's ``resume``): on part ``parts[i]`` every batch number below ``low[i]`` and those in
    ``above[i]`` are acknowledged, with ``samples[i]`` samples and loss and weight sums
    ``loss_sum[i]`` / ``weight_sum[i]``; ``batches_acked`` counts every batch the feeder has had
    acknowledged in the job (control's sign that training moves on)."""

    epoch: int
    batches_acked: int
    parts: list[int]
    low: list[int]
    above: list[list[int]]
    samples: list[int]
    loss_sum: list[float]
    weight_sum: list[float]

    def check(self) -> None:
        n = len(self.parts)
        require(all(len(x) == n for x in (self.low, self.above, self.samples, self.loss_sum,
                                          self.weight_sum)), "per-part lists differ in length")
        require(all(0 <= s < MAX_PARTS for s in self.parts) and len(set(self.parts)) == n,
                "parts must be distinct part numbers")
        require(self.batches_acked >= 0 and all(x >= 0 for x in (*self.low, *self.samples)),
                "negative counts")
        require(all(a >= low for low, above in zip(self.low, self.above, strict=True)
                    for a in above), "above must list batch numbers at or above low")

    def of(self, part: int) -> dict[str, Any] | None:
        """The part's progress as PartMap's ``resume`` carries it (None: not read here)."""
        if part not in self.parts:
            return None
        i = self.parts.index(part)
        return {"epoch": self.epoch, "low": self.low[i], "above": list(self.above[i]),
                "samples": self.samples[i], "loss_sum": self.loss_sum[i],
                "weight_sum": self.weight_sum[i]}


@message("keys")
class BatchKeys(Message):
    """The sparse keys of one batch that this shard owns. The batch's key occurrences form a
    field-major grid (``roles.job.fields``): field f's occurrences are grid positions
    ``bounds[f]`` to ``bounds[f + 1]``; ``positions`` are the grid positions of this shard's
    keys, ``keys`` the 64-bit ids there; ``window`` is the feeder's allocation window the batch
    belongs to (the shard's load records); ``train`` false for an evaluation batch (the shard
    makes no row for it: a key without one gets the row the exported model would score it
    with, so evaluating does not grow the tables)."""

    batch_id: int
    window: int
    samples: int
    bounds: list[int]
    positions: np.ndarray = array("int32", 1)
    keys: np.ndarray = array("int64", 1)
    train: bool = True

    def check(self) -> None:
        require(self.positions.shape == self.keys.shape, "positions and keys differ in length")
        b = self.bounds
        require(self.samples >= 0 and 2 <= len(b) <= MAX_FIELDS + 1 and b[0] == 0
                and all(isinstance(x, int) and 0 <= x for x in b)
                and all(x <= y for x, y in zip(b, b[1:], strict=False)) and b[-1] < 1 << 31,
                "bounds must rise from 0, one per field and one more")
        require(not self.positions.size
                or (self.positions.min() >= 0 and self.positions.max() < self.grid),
                "position outside the batch")
        require(self.positions.size < 2 or bool((np.diff(self.positions) > 0).all()),
                "positions not ascending")

    @property
    def grid(self) -> int:
        return self.bounds[-1]

    @property
    def fields(self) -> int:
        return len(self.bounds) - 1


@message("lookups")
class Lookup(Message):
    """A worker asks a shard for the embeddings of a batch; ``train`` false for evaluation
    (no gradients will follow)."""

    batch_id: int
    train: bool


@message("deliveries")
class Deliver(Message):
    """Mode ``push`` (feeder -> ps): batch ``batch_id`` was granted to worker ``worker``; the
    shard sends it the batch's Embeddings as soon as it has the keys, unasked (``train`` false
    for evaluation: no gradients will follow). Frames: the tag and the header (``batch_id``,
    ``worker``, ``train``), no array."""

    batch_id: int
    worker: int
    train: bool

    def check(self) -> None:
        require(self.batch_id >= 0, "batch id must not be negative")
        require(0 <= self.worker < 1 << 16, "worker index out of range")


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

    def require_finite(self) -> None:
        """The shard's check before Adagrad applies them (a NaN or infinity would stay in the
        rows and their state for good): ProtocolError (inconsistent) otherwise."""
        require(finite(self.grads), "non-finite embedding gradients")


@message("embedding_grads")
class GradsLookup(Message):
    """Mode pull: a batch's gradients and the look-up of the next batch, to one shard in one
    message. The shard applies the gradients first, then answers the look-up as a Lookup of
    ``lookup`` (``train`` as Lookup's), so the rows it sends are read after this update, as
    they would be after two messages. Frames: the tag, the header (``batch_id``, ``lookup``,
    ``train``), ``grads`` (float32, as EmbeddingGrads)."""

    batch_id: int
    lookup: int
    train: bool
    grads: np.ndarray = array("float32", 2)

    def check(self) -> None:
        require(self.batch_id >= 0 and self.lookup >= 0 and self.lookup != self.batch_id,
                "batch ids must be two, not negative")

    def parts(self) -> tuple[EmbeddingGrads, Lookup]:
        return (EmbeddingGrads(batch_id=self.batch_id, grads=self.grads),
                Lookup(batch_id=self.lookup, train=self.train))


@message("samples")
class SampleBatch(Message):
    """Dense features, labels and sample weights of one batch, and how many ids each sample's
    list fields hold (``lengths``: [samples, list fields], in the job's field order; no columns
    without list fields). No sparse keys: the worker gets the batch's embeddings from the
    shards by ``batch_id``, and ``lengths`` tell it where each sample's ids sit in their grid
    (``roles.job.fields``). Evaluation batches (``eval``) must be scored with weights of round
    ``min_round`` or later. With several labels (``[data] labels``) ``labels`` holds each
    sample's, row by row (``[samples, tasks]`` flattened; NaN: that task masked)."""

    batch_id: int
    epoch: int
    eval: bool
    min_round: int
    round: int  # sync mode round: the round the batch belongs to (0 in other modes)
    dense: np.ndarray = array("float32", 2)
    labels: np.ndarray = array("float32", 1)
    weights: np.ndarray = array("float32", 1)
    lengths: np.ndarray = array("int32", 2)

    def check(self) -> None:
        n = self.dense.shape[0]
        require(self.weights.shape == (n,) and self.lengths.shape[0] == n
                and (self.labels.size == n or n > 0 and self.labels.size % n == 0
                     and self.labels.size // n <= MAX_TASKS),
                "dense, labels, weights and lengths differ in length")
        require(not self.lengths.size or int(self.lengths.min()) >= 0, "negative lengths")
        # dense and weights finite: the worker's check before it takes the batch (not here:
        # the codec reads no large payload, see zbus.codec)

    @property
    def tasks(self) -> int:
        """Labels per sample."""
        return self.labels.size // self.dense.shape[0] if self.dense.shape[0] else 1

    def task_labels(self) -> np.ndarray:
        """``[samples]`` for one label, ``[samples, tasks]`` for several."""
        return self.labels if self.tasks == 1 else self.labels.reshape(-1, self.tasks)

    def require_finite(self) -> None:
        """The consumer's check: ProtocolError (inconsistent) if a feature or weight is NaN
        or infinite."""
        require(finite(self.dense) and finite(self.weights), "non-finite features or weights")


@message("acks")
class Taken(Message):
    """A worker pulled the batch and asks to train it."""

    batch_id: int


MAX_TAKES = 128  # batches one message may take: above [train] prefetch + 2 (its bound)


def _check_takes(takes: np.ndarray) -> None:
    require(len(takes) <= MAX_TAKES, f"more than {MAX_TAKES} batches taken at once")
    require(not takes.size or int(takes.min()) >= 0, "negative batch id")
    require(len(np.unique(takes)) == len(takes), "a batch taken twice in one message")


@message("acks")
class Taking(Message):
    """A worker asks to take several batches, in the order it will run them: the feeder reads
    it as one Taken per batch, in that order, and answers them together (Grants). Frames: the
    tag, the header (no scalar), ``takes`` (int64 batch ids, at most MAX_TAKES, distinct)."""

    takes: np.ndarray = array("int64", 1)

    def check(self) -> None:
        _check_takes(self.takes)


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
    """A worker finished a batch: training batches carry the loss, eval batches the scores
    (each sample's probability of each task, row by row, as SampleBatch's labels)."""

    batch_id: int
    samples: int
    loss_sum: float
    weight_sum: float
    preds: np.ndarray = array("float32", 1)


@message("acks")
class Grants(Message):
    """The feeder's answers to a Taking or an AckTaking, together: ``batch_ids[i]`` granted
    (1) or refused (0) by ``granted[i]``, each as a Grant. A take the feeder does not answer
    (its Taken again from the worker holding the batch) is not listed. Frames: the tag, the
    header (no scalar), ``batch_ids`` (int64), ``granted`` (uint8 0/1, as long)."""

    batch_ids: np.ndarray = array("int64", 1)
    granted: np.ndarray = array("uint8", 1)

    def check(self) -> None:
        require(self.granted.shape == self.batch_ids.shape, "one answer per batch")
        require(len(self.batch_ids) <= MAX_TAKES, f"more than {MAX_TAKES} answers at once")
        require(not self.granted.size or int(self.granted.max()) <= 1, "granted must be 0 or 1")

    def answers(self) -> list[tuple[int, bool]]:
        return [(int(b), bool(g)) for b, g in zip(self.batch_ids, self.granted, strict=True)]


@message("acks")
class AckTaking(Message):
    """An Ack and the Takens that follow it, in one message: the feeder places the ack first
    (so that a copy of the acknowledged batch may be asked for in ``takes``), then reads
    ``takes`` as a Taking. Frames: the tag, the header (``batch_id``, ``samples``,
    ``loss_sum``, ``weight_sum``, as Ack), ``preds`` (float32, as Ack), ``takes`` (int64 batch
    ids, 1 to MAX_TAKES, distinct)."""

    batch_id: int
    samples: int
    loss_sum: float
    weight_sum: float
    preds: np.ndarray = array("float32", 1)
    takes: np.ndarray = array("int64", 1)

    def check(self) -> None:
        require(len(self.takes) >= 1, "an AckTaking takes a batch (else: Ack)")
        _check_takes(self.takes)

    @staticmethod
    def of(ack: Ack, takes: list[int]) -> AckTaking:
        return AckTaking(batch_id=ack.batch_id, samples=ack.samples, loss_sum=ack.loss_sum,
                         weight_sum=ack.weight_sum, preds=ack.preds,
                         takes=np.array(takes, dtype=np.int64))

    def ack(self) -> Ack:
        return Ack(batch_id=self.batch_id, samples=self.samples, loss_sum=self.loss_sum,
                   weight_sum=self.weight_sum, preds=self.preds)
