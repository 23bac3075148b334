"""The zbus wire format: how a message is framed, encoded, decoded and validated.

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

This module knows no message: the base node messages are in ``zbus.messages``, the
application's in its protocol package (``roles.protocol``). A message type is known to
``decode`` once its module is imported.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, dataclass_transform

import numpy as np
import orjson

PROTOCOL_VERSION = 8
MAX_HEADER_BYTES = 64 * 1024
MAX_TAG_BYTES = 64

_DTYPES: dict[str, np.dtype[Any]] = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "uint8": np.dtype("u1"),
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
    if typing.TYPE_CHECKING:  # set on every message type by ``message`` (a dataclass)
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def check(self) -> None:
        """Consistency rules between fields; raise ProtocolError when broken."""

    def to_frames(self, sender: str = "", seq: int = 0) -> list[Any]:
        arrays: list[Any] = []
        descr: list[list[Any]] = []
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


_M = TypeVar("_M", bound=Message)


def _runtime_type(hint: Any) -> Any:
    """What ``isinstance`` can check of a type hint: ``list`` for ``list[int]``."""
    return typing.get_origin(hint) or hint


def _item_type(hint: Any) -> Any:
    """The runtime type of a list's items (``int`` of ``list[int]``); None for any other."""
    args = typing.get_args(hint)
    return _runtime_type(args[0]) if args and _runtime_type(hint) is list else None


@dataclass_transform(frozen_default=True, field_specifiers=(field, array))
def message(channel: str = "control") -> Callable[[type[_M]], type[_M]]:
    """Register a frozen, slotted dataclass as a message type of the given channel. Decoding
    checks a scalar field's JSON value against its annotation's runtime type (``list`` for
    ``list[int]``) and a list's items against theirs (``list`` for ``list[list[int]]``)."""

    def wrap(cls: type[_M]) -> type[_M]:
        cls = dataclass(frozen=True, slots=True)(cls)
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
        cls._names = frozenset(n for n, _ in scalars)
        cls._checks = tuple((n, _runtime_type(k), _item_type(k)) for n, k in scalars)
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
