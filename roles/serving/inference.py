"""The Open Inference Protocol (KServe v2, also Triton's and Seldon's) for a zbus model: what a
model says of itself (``metadata``), an infer request's inputs as rows of the job's schema
(``rows_of``), and the response (``response``). Pure code: no sockets, no server.

One input per field of the job, named as its column: ``BYTES`` for a sparse field (a list
field's ids in one string, with the field's separator, as in the data), a number type
(``FP32``, or any other the protocol names) for a dense field; each of shape ``[n]`` (or
``[n, 1]``), one value per row, ``null`` for a missing value (an empty field of a file). The
values are hashed and transformed exactly as in training (``roles.data.readers``: the same
checks, so a value a data file could not hold is refused with the same words). The output is
``probability``, one per row (``[n]``); for a job of several labels (``[data] labels``), one
per row and label (``[n, labels]``, row-major as the protocol flattens it; the output's
``parameters`` name the labels in order).

Anything wrong with a request raises ``InferError`` with the protocol's status and its error
body's text: a missing or unknown input, a wrong type or shape, an unknown model, malformed
JSON, more rows than the server takes in one request.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from roles.data.readers import RawBlock, Schema, _block
from roles.job.settings import Job

OUTPUT = "probability"
NUMBER_TYPES = frozenset({"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                          "INT32", "INT64", "FP16", "FP32", "FP64"})


class InferError(ValueError):
    """A request the server cannot answer: ``status`` (400 bad request, 404 no such model)
    and the error body's text."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status

    def body(self) -> bytes:
        return orjson.dumps({"error": str(self)})


@dataclass(frozen=True)
class Signature:
    """A job's inputs as the protocol names them: its dense fields (numbers) and its sparse
    fields (BYTES, a list field's separator beside it)."""

    name: str
    dense: tuple[str, ...]
    sparse: tuple[str, ...]
    lists: dict[str, str]
    tasks: tuple[str, ...] = ("label",)   # the labels, a probability each

    @classmethod
    def of(cls, job: Job) -> Signature:
        return cls(job.name, tuple(job.dense_fields), tuple(job.sparse_fields),
                   dict(job.list_fields), tuple(job.tasks))

    def output(self, rows: int) -> dict[str, Any]:
        """The output's name, type and shape (``rows`` -1: any), and the labels with
        several."""
        if len(self.tasks) == 1:
            return {"name": OUTPUT, "datatype": "FP32", "shape": [rows]}
        return {"name": OUTPUT, "datatype": "FP32", "shape": [rows, len(self.tasks)],
                "parameters": {"labels": ",".join(self.tasks)}}

    def schema(self) -> Schema:
        return Schema(label="", dense=list(self.dense), sparse=list(self.sparse),
                      lists=dict(self.lists))

    @functools.cached_property
    def sparse_schema(self) -> Schema:
        """The schema of the fields the readers check (the dense ones arrive as numbers)."""
        return Schema(label="", dense=[], sparse=list(self.sparse), lists=dict(self.lists))

    def metadata(self, version: str) -> dict[str, Any]:
        """``GET /v2/models/<name>``."""
        inputs = [{"name": f, "datatype": "FP32", "shape": [-1]} for f in self.dense] + \
                 [{"name": f, "datatype": "BYTES", "shape": [-1],
                   **({"parameters": {"separator": self.lists[f]}} if f in self.lists else {})}
                  for f in self.sparse]
        return {"name": self.name, "versions": [version] if version else [],
                "platform": "zbus", "inputs": inputs,
                "outputs": [self.output(-1)]}


@dataclass
class Request:
    """An infer request read: its id (echoed), its rows as a block of the job's schema."""

    id: str | None
    block: RawBlock

    def __len__(self) -> int:
        return len(self.block)


def rows_of(body: bytes, sig: Signature, max_rows: int) -> Request:
    """An infer request's body as rows (``InferError`` when it is not one the model takes)."""
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InferError(f"malformed JSON: {exc}") from None
    if not isinstance(request, dict):
        raise InferError("an infer request is a JSON object with 'inputs'")
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InferError("the request has no 'inputs' (a list of tensors, one per field)")
    given: dict[str, pa.Array] = {}
    for tensor in inputs:
        name, values = _tensor(tensor, sig)
        if name in given:
            raise InferError(f"input {name!r} is given twice")
        given[name] = values
    wanted = [*sig.dense, *sig.sparse]
    missing = [f for f in wanted if f not in given]
    if missing:
        raise InferError(f"missing input(s) {', '.join(map(repr, missing))}: the model takes "
                         f"one per field ({', '.join(wanted)})")
    rows = {len(v) for v in given.values()}
    if len(rows) != 1:
        raise InferError("the inputs have different numbers of rows: "
                         + ", ".join(f"{k} {len(v)}" for k, v in given.items()))
    n = rows.pop()
    if n == 0:
        raise InferError("the inputs hold no row")
    if n > max_rows:
        raise InferError(f"{n} rows in one request, more than this server takes "
                         f"(--max-batch {max_rows}): send them in several")
    # the sparse and list fields through the readers' checks; the dense ones are numbers
    # already, finite (JSON has no infinity: orjson refuses 1e999), null where missing (NaN)
    table = pa.table([given[f] for f in sig.sparse], names=list(sig.sparse))
    block = _block(sig.sparse_schema, table, n,
                   lambda: [(i, _row_text(given, i)) for i in range(n)], "request", [],
                   len(body))
    block.dense = np.column_stack([given[f].to_numpy(zero_copy_only=False)
                                   for f in sig.dense]) if sig.dense \
        else np.zeros((n, 0), dtype=np.float64)
    if block.rejected:
        r = block.rejected[0]
        raise InferError(f"row {r.line}: {r.reason}")
    request_id = request.get("id")
    return Request(request_id if isinstance(request_id, str) else None, block)


def empty_row(sig: Signature) -> RawBlock:
    """One row of missing values (every field null)."""
    table = pa.table([pa.array([None], pa.float64()) for _ in sig.dense]
                     + [pa.array([None], pa.string()) for _ in sig.sparse],
                     names=[*sig.dense, *sig.sparse])
    return _block(sig.schema(), table, 1, lambda: [(0, "")], "warm-up", [], 0)


def _tensor(tensor: Any, sig: Signature) -> tuple[str, pa.Array]:
    """One input tensor's name and values (float64 or string), checked against the field it
    names."""
    if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
        raise InferError("each input is an object with 'name', 'datatype', 'shape' and 'data'")
    name = tensor["name"]
    if name not in sig.dense and name not in sig.sparse:
        raise InferError(f"unknown input {name!r}: the model's inputs are its fields "
                         f"({', '.join([*sig.dense, *sig.sparse])})")
    datatype, shape, data = tensor.get("datatype"), tensor.get("shape"), tensor.get("data")
    dense = name in sig.dense
    if dense and datatype not in NUMBER_TYPES:
        raise InferError(f"input {name!r} is a dense field: its datatype is a number type "
                         f"(FP32), not {datatype!r}")
    if not dense and datatype != "BYTES":
        raise InferError(f"input {name!r} is a sparse field: its datatype is BYTES (its value "
                         f"as in the data), not {datatype!r}")
    if not isinstance(data, list):
        raise InferError(f"input {name!r} has no 'data' list")
    if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape) \
            or not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)):
        raise InferError(f"input {name!r}: shape {shape!r}; a field's shape is [rows] or "
                         "[rows, 1]")
    if len(shape) == 2:   # [[x], [y], ...] or flat, as the protocol allows
        data = [v[0] if isinstance(v, list) and len(v) == 1 else v for v in data]
    if len(data) != shape[0]:
        raise InferError(f"input {name!r}: shape {shape!r} but {len(data)} value(s)")
    try:   # checked in C; a value of another type makes arrow refuse the whole list
        return name, pa.array(data, pa.float64() if dense else pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        pass
    for i, v in enumerate(data):   # which value, in words
        ok = v is None or (isinstance(v, int | float) if dense else isinstance(v, str))
        if not ok:
            raise InferError(f"input {name!r}, row {i}: {v!r} is not "
                             f"{'a number' if dense else 'a string'}")
    return name, pa.array([None if v is None else float(v) for v in data], pa.float64())


def _row_text(given: dict[str, pa.Array], i: int) -> str:
    return orjson.dumps({k: v[i].as_py() for k, v in given.items()}).decode()


def response(sig: Signature, version: str, request_id: str | None,
             probabilities: np.ndarray) -> bytes:
    """The infer response: one probability per row (and label), with the version that
    computed them."""
    out: dict[str, Any] = {"model_name": sig.name, "model_version": version}
    if request_id is not None:
        out["id"] = request_id
    out["outputs"] = [{**sig.output(len(probabilities)),
                       "data": probabilities.astype(np.float64).reshape(-1).tolist()}]
    return orjson.dumps(out)
