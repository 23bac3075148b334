"""The zbus wire format and the catalogue of every message that crosses the bus.

Frame layout of one message (one ZeroMQ multipart message; a ROUTER socket puts the peer's
identity frame in front, which the socket helpers in ``zbus.sockets`` strip and add):

    frame 0    type tag: the message class name in ASCII, e.g. ``b"Heartbeat"``; it is also the
               topic a SUB socket sees first
    frame 1    header, one orjson object::

                   {"v": PROTOCOL_VERSION, "from": "<sender node id>", "seq": <sender sequence>,
                    "f": {<the message's scalar fields>},
                    "a": [["<dtype>", [dim, ...]], ...]}     one entry per array field, in order

    frame 2..  one raw frame per array field: the C-contiguous little-endian bytes of the array,
               sent without copying when large and rebuilt with ``np.frombuffer`` (read-only)

Decoding checks, and raises ``ProtocolError`` (with a short ``kind`` for counting) when any fails:
the frame count, the type tag (known, ASCII), the header size and JSON, the protocol version,
``from``/``seq``, every scalar field (present, right JSON type, nothing extra), every array
(dtype exactly as declared, number of dimensions, frame size equal to dtype x shape) and the
message's own consistency rules (``check``). A role that receives a bad message counts it by kind,
logs the first of each kind and carries on.

Channels: every message type belongs to one channel, the unit in which nodes count bytes.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import orjson

PROTOCOL_VERSION = 6
MAX_HEADER_BYTES = 64 * 1024
MAX_TAG_BYTES = 64

_DTYPES = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "uint8": np.dtype("u1"),
}


class ProtocolError(ValueError):
    """A message that does not follow the wire format; ``kind`` names the failed check."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


def array(dtype: str, ndim: int) -> Any:
    """Declare an array field of a message: sent as its own raw frame."""
    if dtype not in _DTYPES:
        raise TypeError(f"unsupported dtype {dtype}")
    return field(metadata={"dtype": dtype, "ndim": ndim})


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded message with the envelope fields every message carries."""

    sender: str
    seq: int
    msg: Message
    nbytes: int


_REGISTRY: dict[str, type[Message]] = {}
_BY_TAG: dict[bytes, type[Message]] = {}  # the same, by the type tag frame's bytes
_HEADER_KEYS = frozenset(("v", "from", "seq", "f", "a"))
_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean",
            list: "list", dict: "object"}


def _check_scalar(name: str, value: Any, origin: Any, item: Any) -> Any:
    """``origin``: the field's type (list for list[item])."""
    kind = type(value)
    if kind is origin and kind is not list and kind is not float:
        return value  # int, str, bool, dict: exactly their type (bool is not an int here)
    if origin is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif origin is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            value = float(value)
            ok = math.isfinite(value)
    elif origin is list:
        ok = isinstance(value, list) and all(
            isinstance(v, item) and not isinstance(v, bool) for v in value)
    else:
        ok = isinstance(value, origin)
    if not ok:
        raise ProtocolError("bad_field", f"field {name!r} must be a finite {_SCALARS[origin]}, "
                                         f"got {type(value).__name__}")
    return value


class Message:
    """Base of every message type: the generic codec over the dataclass fields."""

    __slots__ = ()
    CHANNEL: ClassVar[str] = "control"
    _scalars: ClassVar[tuple[tuple[str, Any], ...]] = ()
    _arrays: ClassVar[tuple[tuple[str, str, int], ...]] = ()
    _names: ClassVar[frozenset[str]] = frozenset()
    _checks: ClassVar[tuple[tuple[str, Any, Any], ...]] = ()  # (name, origin, item type)

    def check(self) -> None:
        """Consistency rules between fields; raise ProtocolError when broken."""

    def to_frames(self, sender: str = "", seq: int = 0) -> list[Any]:
        arrays, descr = [], []
        for name, dtype, ndim in self._arrays:
            arr = np.ascontiguousarray(getattr(self, name), dtype=_DTYPES[dtype])
            if arr.ndim != ndim:
                raise ValueError(f"{type(self).__name__}.{name} must have {ndim} dimensions")
            arrays.append(arr.data if arr.nbytes else b"")
            descr.append([dtype, list(arr.shape)])
        header = {"v": PROTOCOL_VERSION, "from": sender, "seq": seq,
                  "f": {name: getattr(self, name) for name, _ in self._scalars}, "a": descr}
        return [type(self).__name__.encode(), orjson.dumps(header), *arrays]

    @classmethod
    def from_frames(cls, frames: typing.Sequence[Any]) -> Message:
        msg = decode(frames).msg
        if not isinstance(msg, cls):
            raise ProtocolError("unexpected_type", f"expected {cls.__name__}, "
                                                   f"got {type(msg).__name__}")
        return msg


def message(channel: str = "control"):
    """Register a frozen, slotted dataclass as a message type of the given channel."""

    def wrap(cls):
        cls = dataclass(frozen=True, slots=True)(cls)
        hints = typing.get_type_hints(cls)
        scalars, arrays = [], []
        for f in dataclasses.fields(cls):
            if "dtype" in f.metadata:
                arrays.append((f.name, f.metadata["dtype"], f.metadata["ndim"]))
            else:
                scalars.append((f.name, hints[f.name]))
        cls.CHANNEL = channel
        cls._scalars = tuple(scalars)
        cls._arrays = tuple(arrays)
        cls._names = frozenset(n for n, _ in scalars)
        cls._checks = tuple((n, typing.get_origin(k) or k, (typing.get_args(k) or (None,))[0])
                            for n, k in scalars)
        _REGISTRY[cls.__name__] = cls
        _BY_TAG[cls.__name__.encode()] = cls
        return cls

    return wrap


def _buffer(frame: Any) -> memoryview:
    if type(frame) is bytes:
        return memoryview(frame)
    buf = getattr(frame, "buffer", frame)  # zmq.Frame or any bytes-like object
    try:
        view = memoryview(buf)
        return view if view.ndim == 1 and view.format == "B" else view.cast("B")
    except (TypeError, ValueError) as exc:
        raise ProtocolError("bad_frame", f"frame of type {type(frame).__name__}") from exc


def decode(frames: typing.Sequence[Any]) -> Envelope:
    """Decode and validate one message (identity frames already removed)."""
    if len(frames) < 2:
        raise ProtocolError("truncated", f"{len(frames)} frame(s), a message has at least 2")
    tag = _buffer(frames[0])
    if len(tag) > MAX_TAG_BYTES:
        raise ProtocolError("unknown_type", f"type tag of {len(tag)} bytes")
    cls = _BY_TAG.get(bytes(tag))
    if cls is None:
        raise ProtocolError("unknown_type", f"type tag {bytes(tag)[:32]!r}")
    raw = _buffer(frames[1])
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError("header_too_large", f"{len(raw)} bytes > {MAX_HEADER_BYTES}")
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ProtocolError("bad_header", "header is not JSON") from None
    if type(header) is not dict or header.keys() != _HEADER_KEYS:
        raise ProtocolError("bad_header", "header must be an object with v, from, seq, f, a")
    if header["v"] != PROTOCOL_VERSION:
        raise ProtocolError("bad_version", f"protocol version {header['v']!r}, "
                                           f"this node speaks {PROTOCOL_VERSION}")
    sender, seq, fields, descr = header["from"], header["seq"], header["f"], header["a"]
    if not isinstance(sender, str) or not isinstance(seq, int) or isinstance(seq, bool):
        raise ProtocolError("bad_header", "from must be a string and seq an integer")
    if not isinstance(fields, dict) or fields.keys() != cls._names:
        raise ProtocolError("bad_field", f"{cls.__name__} fields must be exactly "
                                         f"{sorted(cls._names)}")
    values = {name: _check_scalar(name, fields[name], origin, item)
              for name, origin, item in cls._checks}
    if not isinstance(descr, list) or len(descr) != len(cls._arrays):
        raise ProtocolError("bad_arrays", f"{cls.__name__} has {len(cls._arrays)} array(s)")
    if len(frames) != 2 + len(cls._arrays):
        raise ProtocolError("frame_count", f"{len(frames)} frames for {cls.__name__}, "
                                           f"expected {2 + len(cls._arrays)}")
    nbytes = len(tag) + len(raw)
    for (name, dtype, ndim), entry, frame in zip(cls._arrays, descr, frames[2:], strict=True):
        values[name] = _decode_array(name, dtype, ndim, entry, frame)
        nbytes += values[name].nbytes
    msg = cls(**values)
    msg.check()
    return Envelope(sender=sender, seq=seq, msg=msg, nbytes=nbytes)


def _decode_array(name: str, dtype: str, ndim: int, entry: Any, frame: Any) -> np.ndarray:
    if (type(entry) is not list or len(entry) != 2 or entry[0] != dtype
            or type(entry[1]) is not list or len(entry[1]) != ndim
            or not all(type(d) is int and 0 <= d < 2**40 for d in entry[1])):
        raise ProtocolError("bad_array", f"array {name!r} must be {dtype} with {ndim} dims, "
                                         f"declared {str(entry)[:80]}")
    dt = _DTYPES[dtype]
    buf = _buffer(frame)
    shape = tuple(entry[1])
    if math.prod(shape) * dt.itemsize != len(buf):
        raise ProtocolError("bad_size", f"array {name!r} of shape {shape} needs "
                                        f"{math.prod(shape) * dt.itemsize} bytes, got {len(buf)}")
    arr = np.frombuffer(buf, dtype=dt)
    if ndim != 1:
        arr = arr.reshape(shape)
    if arr.flags.writeable:  # a view of the message buffer: copy before changing it
        arr.flags.writeable = False
    return arr


def message_types() -> dict[str, type[Message]]:
    """Every registered message type by tag (for tests and fuzzing)."""
    return dict(_REGISTRY)


def _finite(a: np.ndarray) -> bool:
    """No NaN or infinity in a float array. A small float32 array's float64 sum is finite
    exactly when every element is (finite float32 values cannot overflow a float64 sum), and
    one reduction costs a third of isfinite + all at this size. (numpy warns "invalid value"
    when +inf and -inf meet in the sum: malformed input only.)"""
    if a.size <= 4096 and a.dtype.itemsize == 4:
        return math.isfinite(np.add.reduce(a, axis=None, dtype=np.float64))
    return bool(np.isfinite(a).all())


def _require(cond: bool, detail: str) -> None:
    if not cond:
        raise ProtocolError("inconsistent", detail)


# ---------------------------------------------------------------------------------------------
# The catalogue. Node <-> control (DEALER -> ROUTER), channel "control".


@message()
class Hello(Message):
    """A node announces itself to control; repeated until control answers with Welcome.
    ``run_id`` is empty from a new node; a node of a run that a restarted control asked to
    introduce itself again (Rejoin) gives the run and whether it was ready."""

    role: str
    index: int
    host: str
    pid: int
    fingerprint: str  # hash of the node's effective job: every node must run the same job
    run_id: str = ""
    ready: bool = False


@message()
class Welcome(Message):
    """Control's answer to Hello: admitted or not, and the run directory to write into."""

    accepted: bool
    reason: str
    run_id: str
    run_dir: str


@message()
class Rejoin(Message):
    """Control, started again on its run (``--resume``), does not know the node that spoke:
    the node says Hello again with its run, then sends its latest reports once more."""

    run_id: str


@message()
class Heartbeat(Message):
    """Periodic load and counters of a node. ``load``: cpu (percent), rss (bytes),
    net (interface -> [bytes sent, bytes received], cumulative); ``counters``: the role's own
    figures, including ``bytes_out``/``bytes_in`` per channel. ``final`` answers Finish."""

    role: str
    index: int
    state: str
    load: dict
    counters: dict
    final: bool


@message()
class Ready(Message):
    """A node finished its start-up (the feeder has loaded its data; ``info`` says what)."""

    info: dict


@message()
class Failure(Message):
    """A node cannot go on (bad data, a broken peer); control fails the job with the reason."""

    reason: str


@message()
class Leaving(Message):
    """A worker stops (SIGTERM) after finishing the batches it was granted."""

    reason: str


@message()
class RoundDrained(Message):
    """The feeder (sync mode round): every batch of round ``round`` is acknowledged."""

    round: int
    samples: int


@message()
class RoundReady(Message):
    """A worker's local progress towards round ``round``: ``steps`` local steps since its last
    contribution (sync mode every: sent once ``sync_every`` are done; lazy: after every local
    round of ``sync_every`` steps). ``idle``: it has nothing more to train for now."""

    round: int
    steps: int
    idle: bool


@message()
class ProbeReply(Message):
    """A node's answer to control's Probe."""

    nonce: int


@message()
class BackupWritten(Message):
    """The aggregator wrote a backup of the dense weights after ``round`` (atomically)."""

    round: int
    path: str
    change: float  # relative change of the weights since the previous backup


@message()
class Restored(Message):
    """The aggregator loaded the backup control named and published it as round ``round``."""

    generation: int
    round: int


@message()
class Exported(Message):
    """A node wrote its part of export ``request`` (file names relative to the export dir)."""

    request: int
    part: str
    files: list[str]


@message()
class EpochTrained(Message):
    """A feeder: every training batch of ``slices`` of ``epoch`` is acknowledged. ``rows``:
    the rows of its slices; ``rows_once`` / ``rows_repeated`` / ``rows_missed``: how many of them
    were trained exactly once, more than once, not at all (counted from the acks)."""

    epoch: int
    samples: int
    batches: int
    loss_sum: float
    weight_sum: float
    seconds: float
    slices: list[int]
    rows: int
    rows_once: int
    rows_repeated: int
    rows_missed: int


@message()
class EvalReport(Message):
    """A feeder scored the eval rows of ``slices`` for ``epoch``: their labels and predictions
    (control joins every feeder's into the epoch's AUC and logloss)."""

    epoch: int
    slices: list[int]
    labels: np.ndarray = array("float32", 1)
    preds: np.ndarray = array("float32", 1)

    def check(self) -> None:
        _require(self.labels.shape == self.preds.shape, "labels and preds differ in length")


@message()
class RoundDone(Message):
    """The aggregator combined round ``round`` and published the new weights."""

    round: int
    contributors: list[str]
    samples_by: list[int]  # samples each contributor trained for the round, in that order
    coefficient: float
    samples: int

    def check(self) -> None:
        _require(len(self.samples_by) == len(self.contributors),
                 "samples_by and contributors differ in length")


# Control -> one node (ROUTER -> DEALER), channel "control".


@message()
class Probe(Message):
    """Control's periodic health probe: a node answers ProbeReply at once. A node that has not
    answered within ``probe_timeout_s`` counts towards the cluster failure rate."""

    nonce: int


# Operators (zbus-ctl, the console) <-> control's request endpoint (DEALER -> ROUTER).


@message()
class ControlRequest(Message):
    """``action``: ``settings`` (read), ``set`` (apply ``changes``: name -> value), ``export``,
    ``backup``, ``aggregate`` (a round now), ``pause`` / ``resume`` (feeding), ``stop`` (end
    the job)."""

    action: str
    changes: dict


@message()
class ControlReply(Message):
    """``ok`` and a message saying what happened (or why not); the effective live settings."""

    ok: bool
    message: str
    settings: dict


# Control PUB -> every node, channel "control".


@message()
class EpochStart(Message):
    epoch: int


@message()
class Membership(Message):
    """The live workers; ``version`` rises with every change (joined, left, failed)."""

    version: int
    workers: list[str]


@message()
class Aggregate(Message):
    """Every worker in ``participants`` sends its Contribution for ``round``."""

    round: int
    participants: list[str]
    reason: str


@message()
class Decision(Message):
    """Sync mode lazy: control's aggregation decision, published each time it is taken, with
    the figures behind it (``local_rounds``: worker -> local rounds since the last round)."""

    round: int
    aggregate: bool
    reason: str
    net_util: float
    failure_rate: float
    local_rounds: dict


@message()
class Settings(Message):
    """The effective live settings (``roles.live``); ``version`` rises with every change."""

    version: int
    values: dict


@message()
class BackupNow(Message):
    """The aggregator writes a backup whatever the change (an operator asked)."""

    request: int


@message()
class Restore(Message):
    """The aggregator restarted: it loads the backup at ``path`` and publishes it as round
    ``round`` under restore ``generation``; workers replace their dense weights with it."""

    generation: int
    round: int
    path: str


@message()
class Export(Message):
    """Write the model into ``dir``: the aggregator the dense weights, each shard its
    embeddings, the feeder the dense transform; each answers Exported."""

    request: int
    dir: str


@message()
class Evaluate(Message):
    """The feeder sends the eval split; workers evaluate with weights of ``round`` or later."""

    epoch: int
    round: int


@message()
class Finish(Message):
    """Training and evaluation are over: every node sends a final Heartbeat."""


@message()
class Feeding(Message):
    """An operator paused (or resumed) the feeder: while ``paused`` it sends no new batch;
    batches already out are trained and acknowledged as usual."""

    paused: bool


@message("status")
class Status(Message):
    """Control's picture of the job for consoles, published every ``status_s`` (channel
    "status"). ``body`` is an orjson object in one uint8 frame (with many nodes it outgrows the
    header cap); its layout is ``roles.status.STATUS_LAYOUT`` and its ``"layout"`` key names
    that version, which a console checks."""

    run_id: str
    body: np.ndarray = array("uint8", 1)

    def snapshot(self) -> dict:
        """The body as a dict; ProtocolError when it is not one JSON object."""
        try:
            value = orjson.loads(self.body.tobytes())
        except orjson.JSONDecodeError:
            raise ProtocolError("bad_body", "Status body is not JSON") from None
        if not isinstance(value, dict):
            raise ProtocolError("bad_body", "Status body is not a JSON object")
        return value

    @classmethod
    def of(cls, run_id: str, snapshot: dict) -> Status:
        return cls(run_id=run_id, body=np.frombuffer(orjson.dumps(snapshot), dtype=np.uint8))


@message()
class Stop(Message):
    """The job ended (``ok`` says how); every node exits."""

    ok: bool
    reason: str


# Skew-aware placement (roles.placement): feeders count, control places, shards hand over.


@message()
class KeyCounts(Message):
    """A feeder's counts of allocation window ``window``: its SpaceSaving summary of the
    heaviest keys (``counts`` over-estimate by at most ``errors``; a summary of ``size``
    counters), all its key-value pairs (``pairs``), pairs per bucket of the key map and pairs
    per shard under the routing of version ``version``."""

    window: int
    version: int
    size: int
    pairs: int
    keys: np.ndarray = array("int64", 1)
    counts: np.ndarray = array("int64", 1)
    errors: np.ndarray = array("int64", 1)
    bucket_pairs: np.ndarray = array("int64", 1)
    shard_pairs: np.ndarray = array("int64", 1)

    def check(self) -> None:
        _require(self.keys.shape == self.counts.shape == self.errors.shape,
                 "keys, counts and errors differ in length")
        _require(0 < self.size and len(self.keys) <= self.size, "more keys than counters")
        _require(self.window >= 0 and self.version >= 0 and self.pairs >= 0,
                 "negative window, version or pairs")
        for name in ("counts", "errors", "bucket_pairs", "shard_pairs"):
            values = getattr(self, name)
            _require(not values.size or values.min() >= 0, f"negative {name}")
        _require(not self.errors.size or bool((self.errors <= self.counts).all()),
                 "an error larger than its count")


@message()
class Placement(Message):
    """The key map of ``version`` (standing; control PUB). ``phase``: ``drain`` (feeders send
    no new batch and report Drained once nothing is in flight), ``move`` (shards hand the rows
    they no longer own to their new owners, and report Moved), ``active`` (feeders route by
    this version). Key k is on ``owners[i]`` when ``keys[i] == k`` (``keys`` sorted), else on
    ``buckets[k mod len(buckets)]``."""

    PHASES: ClassVar[tuple[str, ...]] = ("drain", "move", "active")
    version: int
    phase: str
    buckets: np.ndarray = array("int64", 1)
    keys: np.ndarray = array("int64", 1)
    owners: np.ndarray = array("int64", 1)

    def check(self) -> None:
        _require(self.phase in self.PHASES, f"phase must be one of {self.PHASES}")
        _require(self.version >= 0 and self.buckets.size > 0, "no buckets")
        _require(self.keys.shape == self.owners.shape, "keys and owners differ in length")
        _require(bool((self.buckets >= 0).all()) and (not self.owners.size
                                                      or self.owners.min() >= 0),
                 "negative shard")
        _require(self.keys.size < 2 or bool((np.diff(self.keys) > 0).all()),
                 "keys not sorted and distinct")


@message()
class ShardBack(Message):
    """Shard ``shard`` was restarted from its checkpoint (standing; ``generation`` counts
    restarts): feeders send it the keys of their batches in flight again, workers their
    look-ups that it has not answered."""

    shard: int
    generation: int


@message()
class FeederBack(Message):
    """Feeder ``feeder`` was started again and has loaded the data (standing; ``generation``
    counts restarts): every worker sends it again its latest acks to that feeder (one may have
    been lost with the dead process) and then Holding."""

    feeder: int
    generation: int


@message()
class SliceMap(Message):
    """Control's assignment of the data to the feeders (standing): slice i is the training
    rows ``train[i]`` = [lo, hi) and the eval rows ``eval[i]`` (offsets into each split), fed
    by feeder ``owners[i]``. ``version`` rises when a slice changes hands; ``resume`` then
    says, per slice handed over (by its number as text), where its lost feeder had got to in
    the training pass of ``epoch``: the seqs of the batches acknowledged, their samples and
    loss, and whether that feeder had reported the pass."""

    version: int
    train: list[list]
    eval: list[list]
    owners: list[int]
    resume: dict

    def check(self) -> None:
        n = len(self.owners)
        _require(n > 0 and len(self.train) == n and len(self.eval) == n,
                 "train, eval and owners must be non-empty and equally long")
        for ranges in (self.train, self.eval):
            _require(all(isinstance(r, list) and len(r) == 2
                         and all(isinstance(x, int) and not isinstance(x, bool) for x in r)
                         and 0 <= r[0] <= r[1] for r in ranges), "ranges must be [lo, hi]")
        _require(all(0 <= o < 256 for o in self.owners), "owners must be feeder indexes")
        for key, r in self.resume.items():
            _require(key.isdigit() and int(key) < n and isinstance(r, dict)
                     and isinstance(r.get("epoch"), int) and isinstance(r.get("low"), int)
                     and isinstance(r.get("above"), list)
                     and all(isinstance(a, int) and a >= 0 for a in r["above"])
                     and all(isinstance(r.get(k), (int, float)) and not isinstance(r[k], bool)
                             for k in ("samples", "loss_sum", "weight_sum")),
                     "resume must map slices to epoch, low, above, samples, loss_sum, "
                     "weight_sum")


@message()
class Drained(Message):
    """A feeder paused for placement ``version`` has nothing in flight."""

    version: int


@message("handover")
class Handover(Message):
    """Shard -> shard (DEALER -> ROUTER): the rows of placement ``version`` that move to the
    receiver, with their Adagrad state. Every shard sends one to every other (maybe empty)."""

    version: int
    keys: np.ndarray = array("int64", 1)
    weights: np.ndarray = array("float32", 2)
    accum: np.ndarray = array("float32", 2)

    def check(self) -> None:
        _require(self.weights.shape == self.accum.shape
                 and self.weights.shape[0] == self.keys.shape[0], "rows and keys differ")
        _require(_finite(self.weights) and _finite(self.accum),
                 "non-finite rows")


@message()
class Moved(Message):
    """A shard has sent and received every Handover of placement ``version``."""

    version: int
    sent: int
    received: int


@message()
class ModelPlan(Message):
    """How the network is split over the members of every model-parallel group (standing;
    control PUB): ``owner`` maps each traced node's name to its member (0 = the leader);
    ``summary`` is the plan's figures (``roles.model_graph.ModelPlan``)."""

    parts: int
    owner: dict
    summary: dict

    def check(self) -> None:
        _require(self.parts >= 2, "a plan has at least 2 parts")
        _require(all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                     and 0 <= v < self.parts for k, v in self.owner.items()),
                 "owner must map node names to parts 0..parts-1")


# Feeder -> ps shard (DEALER -> ROUTER), channel "keys".


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
        _require(self.positions.shape == self.keys.shape, "positions and keys differ in length")
        grid = self.samples * self.fields
        _require(self.samples >= 0 and self.fields > 0, "samples/fields out of range")
        _require(not self.positions.size
                 or (self.positions.min() >= 0 and self.positions.max() < grid),
                 "position outside the batch")
        _require(self.positions.size < 2 or bool((np.diff(self.positions) > 0).all()),
                 "positions not ascending")


# Worker <-> ps shard (DEALER -> ROUTER).


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
        _require(self.grid >= 0 and self.mask.shape == ((self.grid + 7) // 8,),
                 "mask does not fit the grid")
        _require(int(np.unpackbits(self.mask).sum()) == len(self.inverse)
                 and not (self.grid % 8 and self.mask.size
                          and self.mask[-1] & (0xFF >> (self.grid % 8))),
                 "mask and inverse differ")
        _require(not self.inverse.size
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


# Feeder -> worker (PUSH -> PULL), channel "samples"; worker <-> feeder, channel "acks".


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
        _require(self.labels.shape == (n,) and self.weights.shape == (n,),
                 "dense, labels and weights differ in length")
        _require(_finite(self.dense) and _finite(self.weights),
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


# Worker <-> aggregator (DEALER -> ROUTER, and aggregator PUB), channel "dense_sync".


@message("dense_sync")
class WeightsRequest(Message):
    """A worker asks for the current global dense weights (at start, or when it missed some)."""


@message("dense_sync")
class Weights(Message):
    """Global dense weights after round ``round`` (and ``step`` gradient steps in mode step).
    ``generation`` counts restores from backup: weights of a newer generation replace a
    worker's weights outright."""

    round: int
    step: int
    generation: int
    params: np.ndarray = array("float32", 1)

    def check(self) -> None:
        _require(_finite(self.params), "non-finite weights")


@message("dense_sync")
class StepGrad(Message):
    """Sync mode step: one local dense gradient, averaged over ``coefficient`` sample weight."""

    coefficient: float
    grads: np.ndarray = array("float32", 1)

    def check(self) -> None:
        _require(_finite(self.grads), "non-finite gradient")


@message("dense_sync")
class Contribution(Message):
    """A worker's share of round ``round``: its change of the dense weights since its last
    contribution (``delta``, empty when it trained nothing) and the sample weight behind it.
    ``done``: the worker leaves; it gets no further weights."""

    round: int
    coefficient: float
    samples: int
    done: bool
    delta: np.ndarray = array("float32", 1)

    def check(self) -> None:
        _require(self.coefficient >= 0 and self.samples >= 0, "negative coefficient or samples")
        _require(_finite(self.delta), "non-finite delta")


@message("dense_sync")
class Partial(Message):
    """Hierarchical aggregation: a group aggregator's share of round ``round``, forwarded to the
    root: ``total`` = sum of coefficient x delta over its contributors, ``coefficient`` the sum
    of their coefficients (float64, so that the root's combination equals the flat one)."""

    round: int
    contributors: list[str]
    samples_by: list[int]
    done: list[str]
    coefficient: float
    samples: int
    total: np.ndarray = array("float64", 1)

    def check(self) -> None:
        _require(len(self.samples_by) == len(self.contributors),
                 "samples_by and contributors differ in length")
        _require(self.coefficient >= 0 and self.samples >= 0, "negative coefficient or samples")
        _require(_finite(self.total), "non-finite partial sum")


# Members of one model-parallel group (DEALER -> ROUTER, each member binds one), channel
# "model_parallel".


@message("model_parallel")
class PartTensors(Message):
    """The tensors on cut edges of step ``step``: values (``phase`` forward) or their gradients
    (backward), float32, concatenated in ``values``; ``names[i]`` (a traced node's name) has
    shape ``shapes[i]``. A name may repeat in backward: one gradient per consuming stage."""

    PHASES: ClassVar[tuple[str, ...]] = ("forward", "backward")
    step: int
    phase: str
    train: bool
    names: list[str]
    shapes: list[list]
    values: np.ndarray = array("float32", 1)

    def check(self) -> None:
        _require(self.phase in self.PHASES, f"phase must be one of {self.PHASES}")
        _require(len(self.names) == len(self.shapes), "names and shapes differ in length")
        total = 0
        for shape in self.shapes:
            _require(len(shape) <= 8 and all(isinstance(d, int) and not isinstance(d, bool)
                                             and d >= 0 for d in shape), "bad shape")
            total += math.prod(shape)
        _require(total == self.values.size, f"shapes hold {total} values, frame has "
                                            f"{self.values.size}")

    def tensors(self) -> list[tuple[str, np.ndarray]]:
        out, at = [], 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            size = math.prod(shape)
            out.append((name, self.values[at:at + size].reshape(shape)))
            at += size
        return out


@message("model_parallel")
class PartCall(Message):
    """Leader -> member: ``load`` its slice of the dense weights (``values``), or send them
    back (``flat``); ``ping`` asks whether it is there with the plan. Answered by PartReply."""

    CALLS: ClassVar[tuple[str, ...]] = ("load", "flat", "ping")
    call: str
    seq: int
    values: np.ndarray = array("float32", 1)

    def check(self) -> None:
        _require(self.call in self.CALLS, f"call must be one of {self.CALLS}")


@message("model_parallel")
class PartReply(Message):
    """Member -> leader: the answer to PartCall ``seq``, or (``call`` = "step") that the
    member finished step ``seq``: its backward is done and its optimiser has stepped."""

    call: str
    seq: int
    values: np.ndarray = array("float32", 1)
