"""``zbus-serve --follow RUN`` of a job that publishes live parameters (``[serving]
publish_ms``, ``roles.protocol.serving``): each ServingCut becomes a version served as soon as
every shard's and the aggregator's part of it is in, on top of the newest complete checkpoint.

``LiveState`` (pure: no socket) is one join: the checkpoint loaded (``base``), each shard's
catch-up (its rows changed since that checkpoint, as of its cut ``last``) and the dense weights;
then every part of every cut, in order. A cut is served once each shard's chain of deltas and
the aggregator's reach it (``advance``): the overlay of rows changed since the checkpoint
(``roles.serving.overlay``) takes each delta, drops first; the version is
``<round>.<checkpoint>.<cut>``. A shard's delta that does not follow the one before it (a
message lost) or that comes from another process (a restarted shard went back to a
checkpoint), or parts of ``MAX_WAITING_CUTS`` cuts waiting for another role's (one that is
down), ends the join (``Resync``): the follower joins again, serving the last version
meanwhile.

``LiveFollower`` owns the sockets, on a thread of its own: one SUB to every ``rows-<i>`` and to
``dense``, and per join one DEALER to each shard (``RowsSince``) and to the aggregator
(``WeightsRequest``), with the operator's CURVE keys when the job's bus is secured. A shard is
asked for its catch-up only once the SUB has had one of its deltas: a PUB drops what it
publishes before a subscriber's connection is up, so that a catch-up answered over the DEALER
before then was followed by deltas never received (a Resync one join in five in the tests);
every delta after one received is received (a shard's deltas travel in order on one
connection). An answer from a process whose deltas have not been received yet (a shard started
again, the SUB not yet reconnected to it) is set aside, and the shard asked again on its first.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import torch
import zmq

from roles.job.settings import Job
from roles.protocol.dense_sync import Weights, WeightsRequest
from roles.protocol.serving import (
    DenseDelta,
    RowDelta,
    RowsCaughtUp,
    RowsSince,
    dequantized,
    quantized,
    row_values,
)
from roles.serving.model import ExportedModel, read_model
from roles.serving.overlay import Overlay
from roles.serving.served import Served
from roles.storage.store import basename
from zbus import security
from zbus.codec import Message, ProtocolError, decode
from zbus.sockets import make_socket

log = logging.getLogger("zbus.serve")
JOIN_TIMEOUT_S = 5.0      # answers to a join's requests not all in: join again
MAX_WAITING_CUTS = 600    # a shard's parts kept for cuts not complete (2 min at 200 ms)
REBASE_ROWS = 50_000      # an overlay this large (and a quarter of the checkpoint's rows) ...
                          # ... is folded into a newer checkpoint by joining on it


def number_of(where: str) -> int:
    """The number of the checkpoint at ``where`` (its directory's or prefix's name)."""
    return int(basename(where.rstrip("/")))


class Resync(Exception):
    """The join cannot go on (said in words): join again."""


class LiveModel:
    """One live version: the checkpoint's model with the rows changed since it (``overlay``),
    each shard's default rows and the dense network; scored as the checkpoint's model is."""

    def __init__(self, base: ExportedModel, overlay: Overlay, defaults: np.ndarray | None,
                 net: torch.nn.Module, manifest: dict):
        self.base, self.overlay, self.defaults, self.net = base, overlay, defaults, net
        self.job, self.transform, self.manifest = base.job, base.transform, manifest

    def find(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        found, rows, live = self.overlay.find(flat)
        rest = np.flatnonzero(~found)
        if len(rest):
            here, base_rows = self.base.find(flat[rest])
            rows[rest], live[rest] = base_rows, here
        return live, rows

    def score(self, keys: np.ndarray, dense: np.ndarray) -> np.ndarray:
        return self.base.score(keys, dense, self.net, self.find, self.defaults)


def merged(overlay: Overlay, parts: list[RowDelta] | list[RowsCaughtUp]) -> Overlay:
    """``overlay`` after the parts of one cut from every shard (or every shard's catch-up),
    in one copy of it: their dropped keys first, then their rows."""
    dim = overlay.rows.shape[1]
    keys = np.concatenate([m.keys for m in parts])
    rows = np.concatenate([row_values(m).reshape(-1, dim) for m in parts])
    # a key is one shard's at a cut; two catch-ups taken either side of a handover may both
    # hold it (the next cut's parts settle which): one of them
    keys, first = np.unique(keys, return_index=True)
    return overlay.merged(keys, rows[first], np.concatenate([m.dropped for m in parts]))


def rounded_as_sent(model: ExportedModel, chunk: int = 1 << 16) -> None:
    """A checkpoint's rows rounded as int8 rows travel (``[serving] row_bytes = 1``), in place:
    a key's row is then what its last delta would give, whichever checkpoint a server joined
    on, so that a live version's answers are the same from every server."""
    for lo in range(0, len(model.rows), chunk):
        model.rows[lo:lo + chunk] = dequantized(*quantized(model.rows[lo:lo + chunk]))


def dense_key(round_: int, step: int, generation: int) -> tuple[int, int, int]:
    """Dense weights' order: a newer generation (a restore) first, then rounds, then steps."""
    return generation, round_, step


class LiveState:
    """One join on checkpoint ``checkpoint`` (its model ``base``) of a job with ``shards``."""

    def __init__(self, base: ExportedModel, checkpoint: int, shards: int):
        self.base, self.checkpoint, self.shards = base, checkpoint, shards
        self.overlay = Overlay.empty(base.layout.row_dim)
        self.last: dict[int, int] = {}          # shard -> its newest cut in the overlay
        self.incarnation: dict[int, str] = {}
        self.defaults: dict[int, np.ndarray] = {}
        self.rows: dict[int, dict[int, RowDelta]] = {i: {} for i in range(shards)}
        self.answers: dict[int, RowsCaughtUp] = {}   # the join's catch-ups, by shard
        self.dense_parts: dict[int, DenseDelta] = {}
        self.dense: tuple[int, int, int] | None = None   # dense_key of ``params``
        self.params: np.ndarray | None = None
        self.net: torch.nn.Module | None = None
        self.round = 0
        self.cut = 0                              # the newest cut served
        self.wants_weights = False                # the aggregator is asked again

    # -- the join ------------------------------------------------------------------------------
    def caught_up(self, m: RowsCaughtUp) -> bool:
        """A shard's answer; False when it is of another checkpoint (join again, on it)."""
        if not 0 <= m.shard < self.shards:
            raise ProtocolError("inconsistent", f"shard {m.shard} of {self.shards}")
        if m.checkpoint != self.checkpoint:
            return False
        m.require_finite()
        self.answers[m.shard] = m
        self.last[m.shard], self.incarnation[m.shard] = m.cut, m.incarnation
        self.defaults[m.shard] = m.defaults
        for cut in [c for c in self.rows[m.shard] if c <= m.cut]:   # in the catch-up
            del self.rows[m.shard][cut]
        if len(self.answers) == self.shards:   # all at once: a key moved between two shards
            self.overlay = merged(self.overlay, list(self.answers.values()))   # since is live
        return True

    def weights(self, m: Weights) -> None:
        key = dense_key(m.round, m.step, m.generation)
        if self.dense is None or key >= self.dense:
            m.require_finite()
            self.dense, self.params, self.round = key, m.params.copy(), m.round
            self.net = None
        self.wants_weights = False

    @property
    def joined(self) -> bool:
        return len(self.last) == self.shards and self.dense is not None

    # -- the parts of each cut -------------------------------------------------------------------
    def add_rows(self, m: RowDelta) -> None:
        if not 0 <= m.shard < self.shards:
            raise ProtocolError("inconsistent", f"shard {m.shard} of {self.shards}")
        if m.shard in self.last and m.cut <= self.last[m.shard]:
            return   # in its catch-up already
        if m.shard in self.incarnation and m.incarnation != self.incarnation[m.shard]:
            raise Resync(f"ps-{m.shard} was started again")
        parts = self.rows[m.shard]
        parts[m.cut] = m
        if len(parts) > MAX_WAITING_CUTS:   # another part of them never comes (a role down)
            raise Resync(f"ps-{m.shard}'s parts of {len(parts)} cuts wait for the others'")

    def add_dense(self, m: DenseDelta) -> None:
        self.dense_parts[m.cut] = m

    def complete(self) -> int | None:
        """The newest cut whose every part is in, once joined."""
        if not self.joined:
            return None
        cuts = set(self.dense_parts)
        for parts in self.rows.values():
            cuts &= set(parts)
        cuts = {c for c in cuts if c > max(self.cut, *self.last.values())}
        return max(cuts) if cuts else None

    def advance(self) -> Served | None:
        """The newest complete cut as a version to serve (None: none newer is complete);
        Resync when a shard's deltas do not follow on from each other."""
        n = self.complete()
        if n is None:
            return None
        by_cut: dict[int, list[RowDelta]] = {}
        for shard, parts in self.rows.items():
            for cut in sorted(c for c in parts if c <= n):
                m = parts.pop(cut)
                if m.previous != self.last[shard]:
                    raise Resync(f"ps-{shard}'s part of cut {m.cut} follows cut {m.previous}, "
                                 f"not {self.last[shard]}: a part was lost")
                m.require_finite()
                by_cut.setdefault(cut, []).append(m)
                self.last[shard], self.defaults[shard] = cut, m.defaults
        for cut in sorted(by_cut):   # cut by cut, each whole: a key one shard dropped and
            self.overlay = merged(self.overlay, by_cut[cut])   # another took in it is live
        for cut in sorted(c for c in self.dense_parts if c <= n):
            self.dense_step(self.dense_parts.pop(cut))
        if self.wants_weights:
            return None
        self.cut = n
        return self.served(n)

    def dense_step(self, m: DenseDelta) -> None:
        key = dense_key(m.round, m.step, m.generation)
        assert self.dense is not None
        if len(m.params):
            m.require_finite()
            self.dense, self.params, self.round, self.net = key, m.params.copy(), m.round, None
        elif key > self.dense:   # weights we have not seen (their cut's part was lost)
            self.wants_weights = True

    def served(self, n: int) -> Served:
        if self.net is None:
            assert self.params is not None
            net = copy.deepcopy(self.base.net)
            torch.nn.utils.vector_to_parameters(torch.from_numpy(self.params), net.parameters())
            self.net = net.eval()
        present = [self.defaults[i] for i in range(self.shards) if len(self.defaults.get(
            i, ()))]
        defaults = np.stack(present) if len(present) == self.shards else None
        manifest = {**self.base.manifest, "round": self.round, "number": self.checkpoint,
                    "cut": n}
        model = LiveModel(self.base, self.overlay, defaults, self.net, manifest)
        return Served(model, f"{self.round}.{self.checkpoint}.{n}", n / 1000.0)

    def wants_rebase(self) -> bool:
        return len(self.overlay) > max(REBASE_ROWS, self.base.held // 4)


class LiveFollower:
    """Follows the job of run directory ``run`` (its ``job``, from the run's ``config.toml``);
    ``newest()`` says where its newest complete checkpoint is; ``replace`` gets each version."""

    def __init__(self, job: Job, newest: Callable[[], str | None],
                 replace: Callable[[Served], None], poll_s: float, max_rows: int = 0):
        self.job, self.newest, self.replace, self.poll_s = job, newest, replace, poll_s
        self.max_rows = max_rows   # a checkpoint of more rows is served from disk
        self.stop = threading.Event()
        self.state: LiveState | None = None
        self.served_cut = 0
        self.joins = 0
        self.resyncs: list[str] = []
        self.ctx = zmq.Context()
        c = job.cluster
        self.curve = security.for_process(self.ctx, c, security.OPERATOR, authenticate=False)
        self.sub = self.socket(zmq.SUB, [*(c.endpoint(f"rows-{i}") for i in range(c.shards)),
                                         c.endpoint("dense")])
        self.askers: list[zmq.Socket] = []
        self.loaded: tuple[str, ExportedModel] | None = None   # the checkpoint read last
        self.wanted = 0   # the newest snapshot a shard answered with
        self.heard: dict[int, str] = {}   # shard -> the incarnation whose deltas reach the SUB
        self.asked: set[int] = set()   # shards asked for this join's catch-up
        self.thread = threading.Thread(target=self.run, name="zbus-live", daemon=True)

    def socket(self, kind: int, endpoints: list[str]) -> zmq.Socket:
        """The bus's socket options (``zbus.sockets``), a CURVE client per endpoint (each has
        its own server key)."""
        sock = make_socket(self.ctx, kind, rcvhwm=100_000,
                           max_bytes=self.job.cluster.max_message_bytes)
        for address in endpoints:
            if self.curve is not None:
                self.curve.client(sock, address)
            sock.connect(address)
        return sock

    def start(self) -> LiveFollower:
        self.thread.start()
        return self

    # -- joining -------------------------------------------------------------------------------
    def join(self) -> LiveState | None:
        """Load the newest complete checkpoint and ask every shard for the rows changed since
        and the aggregator for its weights (None: no checkpoint yet)."""
        where = self.newest()
        if where is None or number_of(where) < self.wanted:
            return None   # (a shard has taken a newer snapshot: wait until it is complete)
        if self.loaded is None or self.loaded[0] != where:
            model = read_model(where, self.max_rows)
            if self.job.serving.row_bytes == 1:
                rounded_as_sent(model)
            self.loaded = (where, model)
        base = self.loaded[1]
        number = number_of(where)
        if self.state is None:   # the checkpoint alone is one consistent version (with int8
            self.replace(Served.of(base))   # rows: rounded as theirs, by every live server)
        for sock in self.askers:
            sock.close(0)
        c = self.job.cluster
        self.askers = [self.socket(zmq.DEALER, [c.endpoint(f"ps-{i}")])
                       for i in range(c.shards)]
        self.askers.append(self.socket(zmq.DEALER, [c.endpoint("aggregator")]))
        self.asked = set()
        for shard in sorted(self.heard):
            self.ask(shard, number)
        self.askers[-1].send_multipart(WeightsRequest().encode("serve", 0)[0])
        self.joins += 1
        return LiveState(base, number, c.shards)

    def ask(self, shard: int, checkpoint: int) -> None:
        """Ask ``shard`` for its rows changed since ``checkpoint`` (this join's)."""
        self.askers[shard].send_multipart(RowsSince(checkpoint=checkpoint).encode("serve", 0)[0])
        self.asked.add(shard)

    def handle(self, state: LiveState, msg: Message) -> bool:
        """One message into the join; False when a shard answered for another checkpoint."""
        match msg:
            case RowDelta() as m:
                if 0 <= m.shard < state.shards:
                    self.heard[m.shard] = m.incarnation
                state.add_rows(m)
                if m.shard not in self.asked:
                    self.ask(m.shard, state.checkpoint)
            case DenseDelta() as m:
                state.add_dense(m)
            case RowsCaughtUp() as m:
                if 0 <= m.shard < state.shards and self.heard.get(m.shard) != m.incarnation:
                    self.asked.discard(m.shard)   # answered before its deltas reached the
                    return True                   # SUB (a restarted shard): ask again then
                if state.caught_up(m):
                    return True
                self.wanted = max(self.wanted, m.checkpoint)
                return False
            case Weights() as m:
                state.weights(m)
        return True

    def poller(self) -> zmq.Poller:
        """The SUB and this join's askers."""
        poller = zmq.Poller()
        for sock in (self.sub, *self.askers):
            poller.register(sock, zmq.POLLIN)
        return poller

    def run(self) -> None:
        state: LiveState | None = None
        began = 0.0
        poller = self.poller()
        next_look = 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            try:
                if state is None or (not state.joined and now - began > JOIN_TIMEOUT_S):
                    state, began = self.join(), now
                    poller = self.poller()   # (the askers of an earlier join are closed)
                    if state is None:
                        self.stop.wait(self.poll_s)
                        continue
                if state.wants_weights:
                    self.askers[-1].send_multipart(WeightsRequest().encode("serve", 0)[0])
                    state.wants_weights = False
                for sock, _ in poller.poll(100):
                    while True:
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        if not self.handle(state, decode(frames).msg):
                            state = None   # another checkpoint: join again, on the newest
                            self.stop.wait(self.poll_s)
                            break
                    if state is None:
                        break
                if state is None:
                    continue
                served = state.advance()
                if served is not None:
                    self.replace(served)
                    self.state, self.served_cut = state, state.cut
                if now >= next_look:
                    next_look = now + self.poll_s
                    if state.joined and state.wants_rebase() and self.newer_than(state):
                        state = None
            except Resync as exc:
                self.resyncs.append(str(exc))
                log.warning("zbus-serve: joining the job again: %s", exc)
                state = None
            except ProtocolError as exc:
                log.warning("zbus-serve: a malformed message refused: %s", exc)
            except (OSError, ValueError, KeyError) as exc:
                log.warning("zbus-serve: cannot load the newest checkpoint: %s", exc)
                state = None
                self.stop.wait(self.poll_s)

    def newer_than(self, state: LiveState) -> bool:
        where = self.newest()
        return where is not None and number_of(where) > state.checkpoint

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=30)
        for sock in [*self.askers, self.sub]:
            sock.close(0)
        if self.curve is not None:
            self.curve.stop()
        self.ctx.term()
