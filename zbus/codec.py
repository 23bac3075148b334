"""The zbus wire format: how a message is framed, encoded, decoded and validated.

Frame layout of one message (one ZeroMQ multipart message; a ROUTER socket puts the peer's
identity frame in front, which the socket helpers in ``zbus.sockets`` strip and add):

    frame 0    type tag: the message class name in ASCII, e.g. ``b"Heartbeat"``; it is also the
               topic a SUB socket sees first
    frame 1    header, one msgpack map::

                   {"v": PROTOCOL_VERSION, "from": "<sender node id>", "seq": <sender sequence>,
                    "f": {<the message's scalar fields>},
                    "a": [["<dtype>", [dim, ...]], ...]}     one entry per array field, in order

    frame 2..  one raw frame per array field: the C-contiguous little-endian bytes of the array,
               sent without copying when large and rebuilt as a read-only array over the
               frame (a view of it when large, of a copy when small: ``COPY_BELOW``)

The header is decoded and validated in one call of a compiled decoder (msgspec) made for each
message type when it is registered: the envelope (version, ``from``, ``seq``), every scalar
field present with its exact type (a bool is not an int; a float is finite; a list's items and
a dict's keys and values are of their declared types), nothing extra, and per array its dtype
exactly as declared, its number of dimensions and each dimension in [0, 2**40). Python then
checks that an ``Any`` is a JSON value (null, bool, int, finite float, str, list or str-keyed
map, at most ``MAX_NESTING`` deep: control messages only), the frame count, each frame's size
against dtype x shape, and the message's own consistency rules (``check``). Whatever fails
raises ``ProtocolError`` with a short ``kind`` for counting (``truncated``,
``unknown_type``, ``header_too_large``, ``bad_header``, ``bad_version``, ``bad_field``,
``bad_arrays``, ``bad_array``, ``frame_count``, ``bad_size``, ``bad_frame``,
``inconsistent``); a role that receives a bad
message counts it by kind, logs the first of each kind and carries on. A header of an older
protocol (JSON, version 7 and before) is refused as ``bad_version``.

What the codec does not do: read a large payload. Decoding costs the same whether an array
holds a kilobyte or a gigabyte (a view of the frame, no pass over it), so a message's ``check``
tests shapes, sizes and small arrays (indices, counts, statistics) but not that a large float
payload (a batch's features, embedding rows and gradients, dense weights, gradients and
deltas) is finite: its consumer finds that where it uses the values, with the same
``ProtocolError`` kind (``inconsistent``), before the values change any state, so that the
message is refused and counted as the codec would have refused it (``finite`` is the check).

Channels: every message type belongs to one channel, the unit in which nodes count bytes.

This module knows no message: the base node messages are in ``zbus.messages``, the
application's in its protocol package (``roles.protocol``). A message type is known to
``decode`` once its module is imported.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, dataclass_transform

import msgspec
import numpy as np
import orjson
import zmq

# 14: StreamScores.task_windows; 13: FollowRequest, FollowJob, ServerReport, int8 rows
# (RowDelta, RowsCaughtUp); 12: several labels (SampleBatch, Ack, EvalReport);
PROTOCOL_VERSION = 14  # 11: Deciding, StreamEnd and StreamScores; 10: Hello.failed, NetworkWanted
# Below this many bytes a copy costs less than a zmq.Frame: a message this small is copied into
# ZeroMQ when sent (``zbus.sockets.send``), and an array frame this small is read as bytes
# when received (numpy makes an array over bytes faster than over a Frame, and bytes are
# read-only already); larger ones go and come without a copy.
COPY_BELOW = 64 * 1024
MAX_HEADER_BYTES = 64 * 1024
MAX_TAG_BYTES = 64
MAX_DIM = 2**40       # a dimension of an array, exclusive
MAX_NESTING = 16      # lists and maps inside an ``Any`` field's value

_DTYPES: dict[str, np.dtype[Any]] = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "uint8": np.dtype("u1"),
    "int8": np.dtype("i1"),
}


class ProtocolError(ValueError):
    """A message that does not follow the wire format; ``kind`` names the failed check."""

    def __init__(self, kind: str, detail: str) -> None:
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


# -- the header's types, as msgspec validates them ------------------------------------------------
# A finite float: NaN fails both bounds, an infinity one of them.
_FINITE = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
_DIM = Annotated[int, msgspec.Meta(ge=0, lt=MAX_DIM)]


def _json_value(value: Any, depth: int = 0) -> bool:
    """What an ``Any`` field may carry: a JSON value (null, bool, int, finite float, str, list,
    str-keyed map) nested at most MAX_NESTING deep, so that no bytes, msgpack extension,
    non-text key or non-finite float reaches a role through one. Checked in Python after the
    compiled decoder (msgspec on Python 3.11 takes no recursive type, and a nested union as
    deep costs seconds to compile per message type): only the control messages that have such
    a field (Heartbeat, Ready, settings, ...) pay for it."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if depth >= MAX_NESTING:
        return False
    if kind is list:
        return all(_json_value(v, depth + 1) for v in value)
    if kind is dict:
        return all(type(k) is str and _json_value(v, depth + 1) for k, v in value.items())
    return False


def _has_any(hint: Any) -> bool:
    return hint is Any or any(_has_any(a) for a in typing.get_args(hint))


def _wire_type(hint: Any) -> Any:
    """The type msgspec checks for a field annotation: ``float`` finite, also inside lists,
    dicts and unions (``Any`` is checked by ``_json_value``)."""
    if hint is float:
        return _FINITE
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return list[_wire_type(args[0])]  # type: ignore[misc]
    if origin is dict:
        return dict[_wire_type(args[0]), _wire_type(args[1])]  # type: ignore[misc]
    if origin is Union or type(hint).__name__ == "UnionType":
        return Union[tuple(_wire_type(a) for a in args)]  # noqa: UP007
    return hint


def _header_type(name: str, scalars: tuple[tuple[str, Any], ...],
                 arrays: tuple[tuple[str, str, int], ...]) -> tuple[Any, Any]:
    """The msgspec Structs of one message type's whole header and of its scalar fields (no
    defaults: every key present; no unknown key): ``decode`` checks a header against the
    first, ``Message.encode`` writes one with them."""
    fields = msgspec.defstruct(f"{name}Fields", [(n, _wire_type(h)) for n, h in scalars],
                               forbid_unknown_fields=True)
    tup, lit = typing.cast(Any, tuple), typing.cast(Any, Literal)  # built at run time
    # one entry per array: its dtype's name, then a tuple of exactly ndim dimensions
    descr = tup[tuple(tup[lit[dtype], tup[(_DIM,) * ndim]] for _, dtype, ndim in arrays)
                or ()]
    return msgspec.defstruct(
        f"{name}Header",
        [("v", int), ("sender", str, msgspec.field(name="from")), ("seq", int),
         ("f", fields), ("a", descr)],
        forbid_unknown_fields=True), fields


_REGISTRY: dict[str, type[Message]] = {}
_BY_TAG: dict[bytes, type[Message]] = {}  # the same, by the type tag frame's bytes
_HEADER_KEYS = frozenset(("v", "from", "seq", "f", "a"))
_ENCODER = msgspec.msgpack.Encoder()
_GENERIC = msgspec.msgpack.Decoder()


class Message:
    """Base of every message type: the generic codec over the dataclass fields."""

    __slots__ = ()
    CHANNEL: ClassVar[str] = "control"
    _scalars: ClassVar[tuple[tuple[str, Any], ...]] = ()
    _arrays: ClassVar[tuple[tuple[str, str, int], ...]] = ()
    _scalar_names: ClassVar[tuple[str, ...]] = ()
    _names: ClassVar[frozenset[str]] = frozenset()
    _decoder: ClassVar[msgspec.msgpack.Decoder[Any]]
    # per array field: (name, its dtype's name, dtype, ndim, itemsize)
    _frames: ClassVar[tuple[tuple[str, str, np.dtype[Any], int, int], ...]] = ()
    # the slots' setters (member descriptors), scalar fields then array fields: ``decode``
    # fills a new message through them (a frozen dataclass's __init__ costs 3 us)
    _setters: ClassVar[tuple[Callable[[Any, Any], None], ...]] = ()
    _json_fields: ClassVar[tuple[int, ...]] = ()  # the scalar fields with an ``Any`` inside
    # what ``encode`` needs, made once per type by ``message``: the type tag frame, the
    # header's Struct types (the very ones ``_decoder`` checks against: one definition of the
    # header), and a function that reads the scalar fields' values as a tuple
    _tag: ClassVar[bytes] = b""
    _header_struct: ClassVar[Any]
    _fields_struct: ClassVar[Any]
    _get_scalars: ClassVar[Callable[[Any], tuple[Any, ...]]]
    if typing.TYPE_CHECKING:  # set on every message type by ``message`` (a dataclass)
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def check(self) -> None:
        """Consistency rules between fields; raise ProtocolError when broken."""

    def encode(self, sender: str = "", seq: int = 0) -> tuple[list[Any], int]:
        """The message's frames (see the module's docstring) and their size in bytes."""
        cls = type(self)
        frames: list[Any] = [cls._tag, b""]
        descr: list[tuple[str, tuple[int, ...]]] = []
        nbytes = len(cls._tag)
        for name, dtype, dt, ndim, _ in cls._frames:
            arr = getattr(self, name)
            if type(arr) is not np.ndarray or (arr.dtype is not dt and arr.dtype != dt) \
                    or not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr, dtype=dt)
            if arr.ndim != ndim:
                raise ValueError(f"{cls.__name__}.{name} must have {ndim} dimensions")
            size = arr.nbytes
            frames.append(arr if size else b"")  # its bytes, through the buffer protocol
            descr.append((dtype, arr.shape))
            nbytes += size
        header = _ENCODER.encode(cls._header_struct(
            PROTOCOL_VERSION, sender, seq, cls._fields_struct(*cls._get_scalars(self)), descr))
        frames[1] = header
        return frames, nbytes + len(header)

    def to_frames(self, sender: str = "", seq: int = 0) -> list[Any]:
        return self.encode(sender, seq)[0]

    @classmethod
    def from_frames(cls, frames: typing.Sequence[Any]) -> Message:
        msg = decode(frames).msg
        if not isinstance(msg, cls):
            raise ProtocolError("unexpected_type", f"expected {cls.__name__}, "
                                                   f"got {type(msg).__name__}")
        return msg


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function of a message that gives its fields ``names`` as a tuple."""
    if len(names) > 1:
        return operator.attrgetter(*names)
    if names:
        one = operator.attrgetter(names[0])
        return lambda msg: (one(msg),)
    return lambda msg: ()


_M = TypeVar("_M", bound=Message)


@dataclass_transform(frozen_default=True, field_specifiers=(field, array))
def message(channel: str = "control") -> Callable[[type[_M]], type[_M]]:
    """Register a frozen, slotted dataclass as a message type of the given channel, with the
    compiled decoder of its header: each scalar field is checked against its annotation
    (``int``, ``float``, ``str``, ``bool``, lists and dicts of them, ``Any``)."""

    def wrap(cls: type[_M]) -> type[_M]:
        cls = dataclass(frozen=True, slots=True)(cls)
        if hasattr(cls, "__post_init__"):  # decode does not call __init__
            raise TypeError(f"message {cls.__name__}: no __post_init__; rules go in check()")
        hints = typing.get_type_hints(cls)
        scalars: list[tuple[str, Any]] = []
        arrays: list[tuple[str, str, int]] = []
        for f in dataclasses.fields(cls):
            if "dtype" in f.metadata:
                arrays.append((f.name, f.metadata["dtype"], f.metadata["ndim"]))
            else:
                scalars.append((f.name, hints[f.name]))
        cls.CHANNEL = channel
        cls._scalars = tuple(scalars)
        cls._arrays = tuple(arrays)
        cls._scalar_names = tuple(n for n, _ in scalars)
        cls._names = frozenset(cls._scalar_names)
        cls._frames = tuple((n, d, _DTYPES[d], k, _DTYPES[d].itemsize) for n, d, k in arrays)
        cls._json_fields = tuple(i for i, (_, h) in enumerate(scalars) if _has_any(h))
        cls._setters = tuple(cls.__dict__[n].__set__ for n in (*cls._scalar_names,
                                                                 *(a[0] for a in arrays)))
        cls._header_struct, cls._fields_struct = _header_type(cls.__name__, cls._scalars,
                                                              cls._arrays)
        cls._decoder = msgspec.msgpack.Decoder(cls._header_struct)
        cls._tag = cls.__name__.encode()
        cls._get_scalars = _getter(cls._scalar_names)
        _REGISTRY[cls.__name__] = cls
        _BY_TAG[cls._tag] = cls
        return cls

    return wrap


def _buffer(frame: Any) -> Any:
    """The bytes of a frame: bytes and a zmq.Frame as they are (both give their bytes through
    the buffer protocol, and their size as ``len``), any other bytes-like object as a flat
    memoryview."""
    kind = type(frame)
    if kind is bytes or kind is zmq.Frame:
        return frame
    buf = getattr(frame, "buffer", frame)  # a zmq.Frame's subclass or any bytes-like object
    try:
        view = memoryview(buf)
        return view if view.ndim == 1 and view.format == "B" else view.cast("B")
    except (TypeError, ValueError) as exc:
        raise ProtocolError("bad_frame", f"frame of type {type(frame).__name__}") from exc


def decode(frames: typing.Sequence[Any]) -> Envelope:
    """Decode and validate one message (identity frames already removed)."""
    if len(frames) < 2:
        raise ProtocolError("truncated", f"{len(frames)} frame(s), a message has at least 2")
    tag = frames[0]
    if type(tag) is not bytes and type(tag) is not _FRAME:
        tag = _buffer(tag)
    if len(tag) > MAX_TAG_BYTES:
        raise ProtocolError("unknown_type", f"type tag of {len(tag)} bytes")
    cls = _BY_TAG.get(tag if type(tag) is bytes else tag.bytes if type(tag) is _FRAME
                      else bytes(tag))
    if cls is None:
        raise ProtocolError("unknown_type", f"type tag {bytes(tag)[:32]!r}")
    raw = frames[1]
    if type(raw) is not bytes and type(raw) is not _FRAME:
        raw = _buffer(raw)
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError("header_too_large", f"{len(raw)} bytes > {MAX_HEADER_BYTES}")
    try:
        header = cls._decoder.decode(raw)
    except _DECODE_ERRORS as exc:
        raise _header_error(cls, raw, exc) from None
    if header.v != PROTOCOL_VERSION:
        raise ProtocolError("bad_version", f"protocol version {header.v!r}, "
                                           f"this node speaks {PROTOCOL_VERSION}")
    shapes = header.a
    if len(frames) != 2 + len(shapes):
        raise ProtocolError("frame_count", f"{len(frames)} frames for {cls.__name__}, "
                                           f"expected {2 + len(shapes)}")
    msg = _new(cls)  # filled through its slots: no __init__, no __post_init__
    setters = cls._setters  # the scalar fields' first, then the arrays'
    scalars = _astuple(header.f)
    for i in cls._json_fields:
        if not _json_value(scalars[i]):
            raise ProtocolError("bad_field", f"{cls.__name__} field {cls._scalar_names[i]!r} "
                                             f"is not a JSON value at most {MAX_NESTING} deep")
    for setter, value in zip(setters, scalars, strict=False):
        setter(msg, value)
    nbytes = len(tag) + len(raw)
    i = len(scalars)
    for (name, _, dt, _, _), (_, shape), frame in zip(cls._frames, shapes, frames[2:],
                                                      strict=True):
        kind = type(frame)
        if kind is _FRAME and len(frame) < COPY_BELOW:
            frame = frame.bytes  # read-only, and cheaper than a view of a small Frame
        elif kind is not bytes:
            frame = _buffer(frame)
        size = len(frame)
        try:  # the array's shape over the frame's bytes: a frame too short raises
            arr = _ndarray(shape, dt, frame)
        except (TypeError, ValueError):
            arr = None
        if arr is None or arr.nbytes != size:  # too short, or longer than the shape
            raise ProtocolError("bad_size", f"array {name!r} of shape {shape} needs "
                                            f"{math.prod(shape) * dt.itemsize} bytes, "
                                            f"got {size}")
        if type(frame) is not bytes and arr.flags.writeable:
            arr.flags.writeable = False  # a view of the message buffer: copy to change it
        setters[i](msg, arr)
        i += 1
        nbytes += size
    msg.check()
    env = _new(Envelope)
    _ENV_SENDER(env, header.sender)
    _ENV_SEQ(env, header.seq)
    _ENV_MSG(env, msg)
    _ENV_NBYTES(env, nbytes)
    return env


_FRAME = zmq.Frame
_ndarray = np.ndarray
_astuple = msgspec.structs.astuple
_new = object.__new__
# Envelope's slots, filled as a message's are (its frozen __init__ costs a microsecond)
_ENV_SENDER, _ENV_SEQ, _ENV_MSG, _ENV_NBYTES = (
    Envelope.__dict__[n].__set__ for n in ("sender", "seq", "msg", "nbytes"))


_PATH = re.compile(r"`(\$[^`]*)`$")


# what msgspec raises on a malformed header: its own errors, and a string's bad UTF-8
_DECODE_ERRORS = (msgspec.MsgspecError, ValueError, RecursionError)


def _header_error(cls: type[Message], raw: Any, exc: Exception) -> ProtocolError:
    """The ProtocolError of a header the compiled decoder refused, by what is wrong with it
    (the error path only: the header is read again, without its type)."""
    raw = bytes(memoryview(raw))  # a zmq.Frame neither slices nor goes to orjson
    try:
        header = _GENERIC.decode(raw)
    except _DECODE_ERRORS:
        header = _legacy_header(raw)
        if header is None:
            return ProtocolError("bad_header", "header is not one msgpack map")
    if type(header) is not dict or header.keys() != _HEADER_KEYS:
        return ProtocolError("bad_header", "header must be a map of v, from, seq, f, a")
    if type(header["v"]) is not int or header["v"] != PROTOCOL_VERSION:
        return ProtocolError("bad_version", f"protocol version {str(header['v'])[:20]}, "
                                            f"this node speaks {PROTOCOL_VERSION}")
    found = _PATH.search(str(exc))
    path = found.group(1) if found else "$"
    detail = f"{cls.__name__}: {exc}"[:300]
    if path == "$.f" or path.startswith(("$.f.", "$.f[")):
        return ProtocolError("bad_field", detail)
    if path == "$.a":
        return ProtocolError("bad_arrays", detail)
    if path.startswith("$.a["):
        return ProtocolError("bad_array", detail)
    return ProtocolError("bad_header", detail)


def _legacy_header(raw: Any) -> dict[str, Any] | None:
    """A header of protocol 7 or before (JSON), to be refused by its version; None if the
    header is not that either."""
    if not bytes(raw[:1]) == b"{":
        return None
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return header if type(header) is dict else None


def message_types() -> dict[str, type[Message]]:
    """Every registered message type by tag (for tests and fuzzing)."""
    return dict(_REGISTRY)


def finite(a: np.ndarray) -> bool:
    """No NaN or infinity in a float array. A small float32 array's float64 sum is finite
    exactly when every element is (finite float32 values cannot overflow a float64 sum), and
    one reduction costs a third of isfinite + all at this size. (numpy warns "invalid value"
    when +inf and -inf meet in the sum: malformed input only.)"""
    if a.size <= 4096 and a.dtype.itemsize == 4:
        return math.isfinite(np.add.reduce(a, axis=None, dtype=np.float64))
    return bool(np.isfinite(a).all())


def require(cond: bool, detail: str) -> None:
    if not cond:
        raise ProtocolError("inconsistent", detail)


def require_finite(a: np.ndarray, detail: str) -> None:
    """A consumer's check of a large float payload before it uses it (see the module's
    docstring): the ProtocolError the codec would have raised."""
    if not finite(a):
        raise ProtocolError("inconsistent", detail)
