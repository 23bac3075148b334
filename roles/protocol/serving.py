"""Live parameters for serving processes (``zbus-serve --follow``; ``roles.serving.live``).

Every ``[serving] publish_ms`` control publishes a ``ServingCut`` (control PUB). At each cut,
every shard publishes on its own PUB (endpoint ``rows-<i>``) one ``RowDelta``: the rows that
changed since its previous cut (created, trained, handed in), the keys that left it since
(expired, evicted, handed out: tombstones) and its default rows; the root aggregator publishes
on its (endpoint ``dense``) one ``DenseDelta``: the dense weights when they changed since its
previous cut, else only the (round, step, generation) they are at. A serving process serves
cut ``n`` once every shard's and the aggregator's part of ``n`` is in: one version, named by
the cut.

A server that starts late, or that missed a message (each part names the cut before it:
``previous``), loads the newest complete checkpoint and asks each shard for the rows changed
since that checkpoint (``RowsSince`` on the shard's ROUTER, answered with ``RowsCaughtUp``) and
the aggregator for its weights (``WeightsRequest``); the deltas after those answers follow.

A serving process on another host asks control for the job (``FollowRequest`` ->
``FollowJob``, on control's request endpoint: ``zbus-serve --follow tcp://host:port``), and
every serving process that follows a job tells control what it serves (``ServerReport``), which
the status lists for consoles.
"""

from __future__ import annotations

import math

import numpy as np

from zbus.codec import Message, array, finite, message, require


@message()
class ServingCut(Message):
    """Control PUB: every shard and the root aggregator publish their part of cut ``number``
    (milliseconds since the epoch on control's clock: rises across a resumed control, and says
    when the version was cut)."""

    number: int


INT8_MAX = 127   # an int8 row's values are in [-127, 127] times its scale


def quantized(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows as int8 (``[serving] row_bytes = 1``): each row's scale is its largest magnitude
    over 127 (0 for a row of zeros), each value the nearest multiple of it: the row comes back
    (``dequantized``) within half a scale of each value."""
    rows = np.asarray(rows, dtype=np.float32)
    scales = (np.abs(rows).max(axis=1) / np.float32(INT8_MAX)).astype(np.float32) \
        if rows.size else np.zeros(len(rows), np.float32)
    safe = np.where(scales > 0, scales, np.float32(1.0))
    q = np.clip(np.rint(rows / safe[:, None]), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q, scales


def dequantized(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    out: np.ndarray = q.astype(np.float32) * scales[:, None]
    return out


def check_rows(keys: np.ndarray, rows: np.ndarray, qrows: np.ndarray, scales: np.ndarray,
               defaults: np.ndarray) -> None:
    """The keys' rows as float32 (``rows``) or as int8 with a scale each (``qrows``,
    ``scales``): one of the two holds them, the other none."""
    n = keys.shape[0]
    require(rows.ndim == 2 and qrows.ndim == 2, "rows of another shape")
    as_float = rows.shape[0] == n and qrows.shape[0] == 0 and scales.shape[0] == 0
    as_int8 = n > 0 and rows.shape[0] == 0 and qrows.shape[0] == n and scales.shape[0] == n
    require(as_float or as_int8, "rows and keys differ")
    require(not (scales < 0).any(), "negative scales")
    width = qrows.shape[1] if as_int8 else rows.shape[1]
    require(defaults.ndim == 2 and (not len(defaults) or defaults.shape[1] == width),
            "default rows of another width")


@message("serving")
class RowDelta(Message):
    """Shard ``shard``'s part of cut ``cut`` (its PUB, ``rows-<i>``): the current ``rows`` of
    ``keys`` changed since cut ``previous`` (0: the first this process publishes), the keys
    ``dropped`` since (apply them first: a key dropped and made again is in both), and its
    default rows (admission's, one per field; none without admission). ``incarnation`` names
    the shard's process: a restarted shard's rows went back to a checkpoint."""

    shard: int
    cut: int
    previous: int
    incarnation: str
    keys: np.ndarray = array("int64", 1)
    rows: np.ndarray = array("float32", 2)
    dropped: np.ndarray = array("int64", 1)
    defaults: np.ndarray = array("float32", 2)
    qrows: np.ndarray = array("int8", 2)      # [serving] row_bytes = 1: the rows as int8 ...
    scales: np.ndarray = array("float32", 1)  # ... and each one's scale

    def check(self) -> None:
        require(self.shard >= 0 and self.cut > self.previous >= 0, "bad shard or cut numbers")
        check_rows(self.keys, self.rows, self.qrows, self.scales, self.defaults)

    def require_finite(self) -> None:
        require(finite(self.rows) and finite(self.defaults) and finite(self.scales),
                "non-finite rows")


@message("serving")
class DenseDelta(Message):
    """The root aggregator's part of cut ``cut`` (its PUB, ``dense``): its weights at
    (``round``, ``step``, ``generation``), in ``params`` when they changed since cut ``previous``
    (empty: unchanged)."""

    cut: int
    previous: int
    round: int
    step: int
    generation: int
    params: np.ndarray = array("float32", 1)

    def check(self) -> None:
        require(self.cut > self.previous >= 0, "bad cut numbers")

    def require_finite(self) -> None:
        require(finite(self.params), "non-finite weights")


@message("serving")
class RowsSince(Message):
    """A serving process -> a shard's ROUTER: the rows changed since checkpoint
    ``checkpoint`` (the one it loaded)."""

    checkpoint: int


@message("serving")
class RowsCaughtUp(Message):
    """The shard's answer to RowsSince: the rows changed and keys dropped since its newest
    snapshot, ``checkpoint`` (when it is not the one asked for, the server loads that one once
    it is complete, and asks again; ``keys`` are then empty), as they are after its cut
    ``cut`` (the deltas of later cuts follow), with its default rows and ``incarnation``."""

    shard: int
    checkpoint: int
    cut: int
    incarnation: str
    keys: np.ndarray = array("int64", 1)
    rows: np.ndarray = array("float32", 2)
    dropped: np.ndarray = array("int64", 1)
    defaults: np.ndarray = array("float32", 2)
    qrows: np.ndarray = array("int8", 2)      # [serving] row_bytes = 1: the rows as int8 ...
    scales: np.ndarray = array("float32", 1)  # ... and each one's scale

    def check(self) -> None:
        require(self.shard >= 0 and self.cut >= 0, "bad shard or cut number")
        check_rows(self.keys, self.rows, self.qrows, self.scales, self.defaults)

    def require_finite(self) -> None:
        require(finite(self.rows) and finite(self.defaults) and finite(self.scales),
                "non-finite rows")


@message("serving")
class FollowRequest(Message):
    """A serving process -> control's request endpoint (``zbus-serve --follow tcp://...``):
    the job it is to follow. ``server`` names the process (host:port/pid)."""

    server: str


@message("serving")
class FollowJob(Message):
    """Control's answer to FollowRequest: the run's effective job file (``config.toml``: the
    job's endpoints, its ``[serving]`` and ``[checkpoint]``) and where its checkpoints are
    (``[checkpoint] dir``, else the run directory's ``checkpoints`` on control's host)."""

    run_id: str
    job_text: str
    checkpoints: str


@message("serving")
class ServerReport(Message):
    """A serving process -> control's request endpoint, every ``REPORT_S`` while it follows a
    job (unanswered): what the console lists. ``run_id``: the run it follows (control lists
    only its own run's servers); ``version``: the version served ("" none yet);
    ``version_lag_s``: now minus when its parameters were trained (-1: none); the requests,
    rows and infer latencies of the last interval (p50/p99 -1 with no request)."""

    server: str
    run_id: str
    url: str
    version: str
    ready: bool
    version_lag_s: float
    requests_per_s: float
    rows_per_s: float
    p50_ms: float
    p99_ms: float

    def check(self) -> None:
        require(bool(self.server) and len(self.server) <= 200 and len(self.url) <= 300
                and len(self.version) <= 100, "bad server name, url or version")
        require(all(math.isfinite(x) for x in (self.version_lag_s, self.requests_per_s,
                                                self.rows_per_s, self.p50_ms, self.p99_ms)),
                "non-finite figures")
        require(self.requests_per_s >= 0 and self.rows_per_s >= 0, "negative rates")


def row_values(m: RowDelta | RowsCaughtUp) -> np.ndarray:
    """The keys' rows of a RowDelta or RowsCaughtUp as float32 (``[keys, width]``), whichever
    way they travelled (int8 rows scaled back)."""
    if m.qrows.shape[0]:
        return dequantized(m.qrows, m.scales)
    return m.rows
