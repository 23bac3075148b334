"""A parameter-server shard: the embedding rows of the keys it owns and their Adagrad state.

Per batch: the feeder sends the keys this shard owns (BatchKeys); the shard dedupes them, finds
or creates their rows and keeps (rows, mask, inverse) until the batch's gradients arrive.
A worker's Lookup (mode ``pull``), or the feeder's Deliver naming the worker granted the batch
(mode ``push``: sent to that worker unasked), is answered as soon as both the keys and the
request are here (in either order), and so are gradients that arrive before the keys (after
a restart, a worker's queued gradients can overtake the keys the feeder sends again; at most
``MAX_WAITING`` are kept).
EmbeddingGrads are applied once per batch: the shard remembers applied batch ids (the current
and the previous epoch; per part its newest window of batch numbers exactly, every older one
counted applied, so that a stream's pass of weeks holds a few KB: ``AppliedBatches``), so a
gradient sent twice is refused and counted. A batch sent
again (its worker died) brings its keys again: while the batch is held that is a no-op, after
its gradients were applied the rows are held again for the new worker's look-up, and its
gradients will be refused.

Checkpoints (``roles.checkpoint.shard``): at control's cut (Checkpoint ``write``) the
shard waits until every training batch it holds has its gradients (feeders have drained, so
they are on their way), forks a child that writes its rows, their Adagrad state and the applied
batch ids (the whole table, or the rows changed since its previous file), reports Snapshotted
with the pause, and CheckpointPart once the child is done. A shard started again restores the
newest complete checkpoint control names in its Welcome; the updates applied after it are lost,
and counted exactly from the log of the batches applied after each snapshot
(``roles.algorithms.shard.applied_log``), in its Ready (``updates_lost``; control's
``shard_recoveries``).

Skew-aware placement (``roles.algorithms.control.placement``): the shard times its work per
allocation window of the batches (look-ups: finding or creating rows and gathering them; updates:
the Adagrad step), in CPU time of its thread (``time.thread_time``: on a shared machine, wall time
would count the moments the scheduler gave the core to someone else as the shard's own slowness),
and reports each window once it is finished, with its heartbeats, until control says it has
recorded it (``roles.algorithms.shard.window_work``): control turns them into the capacity
predictor's history. When control publishes a key map in phase ``move``, the shard waits until no
training batch it holds still expects gradients, sends every other shard one Handover with
the rows (and Adagrad state) it no longer owns, takes the rows others send it, and reports
Moved. ``--slowdown N`` (a test aid) makes the shard N times as slow: after each piece of work
it rests (``Loop.rest``: handles nothing) (N - 1) x the CPU time the work took, and counts N x
that time as its processing time.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from roles.algorithms.shard.admission import Admission
from roles.algorithms.shard.applied import AppliedBatches
from roles.algorithms.shard.applied_log import AppliedLog
from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.algorithms.shard.expiry import Expiry
from roles.algorithms.shard.window_work import WindowLedger
from roles.algorithms.shared.key_map import KeyMap
from roles.checkpoint.files import checkpoint_store, latest_complete, read_manifest
from roles.checkpoint.model_files import ExportAnswers, embeddings_file, save_embeddings
from roles.checkpoint.shard import ShardCheckpoints, read_chain
from roles.job.cli import role_main
from roles.job.settings import Job
from roles.protocol.checkpoint import Checkpoint, Snapshotted
from roles.protocol.datapath import (
    BatchKeys,
    Deliver,
    EmbeddingGrads,
    Embeddings,
    GradsLookup,
    Lookup,
    split_batch_id,
)
from roles.protocol.lifecycle import Export
from roles.protocol.placement import Handover, Moved, Placement, WorkRecorded
from roles.protocol.serving import RowsSince, ServingCut
from roles.serving.publishing import RowPublisher
from roles.storage.fs import StorageError
from roles.storage.store import Store, parent
from zbus.codec import ProtocolError
from zbus.messages import Ready
from zbus.node import Node

log = logging.getLogger(__name__)
MAX_WAITING = 10_000  # look-ups parked for keys that have not arrived (bounded)
MAX_EVAL_KEPT = 256   # answered eval batches still held, for a second copy's look-up


@dataclass
class HeldBatch:
    rows: np.ndarray       # table row of each distinct key
    mask: np.ndarray       # one bit per batch grid position, set where the key is this
                           # shard's (Embeddings.mask)
    grid: int
    inverse: np.ndarray    # int32 index into rows of each key occurrence
    window: int = 0        # the feeder's allocation window
    train: bool = True     # gradients will follow (false when its keys or a look-up said eval)
    pending: tuple[np.ndarray, np.ndarray] | None = None  # keys without a row, and their
                           # occurrences: sightings counted when the gradients are applied
    fresh: tuple[np.ndarray, np.ndarray] | None = None  # an eval batch's keys without a row:
                           # (indices into rows, their initial rows); rows there are stand-ins
    widths: np.ndarray | None = None  # each row's table's width where tables are narrower
                           # than the rows (row-wise Adagrad's mean: EmbeddingTable.adagrad)

    def table_rows(self) -> np.ndarray:
        """The table rows the batch uses (stand-ins left out)."""
        return self.rows if self.fresh is None else np.delete(self.rows, self.fresh[0])


class Shard(Node):
    role = "ps"

    def __init__(self, job: Job, index: int, slowdown: float = 1.0):
        super().__init__(job.cluster, index, job.fingerprint())
        self.exports = ExportAnswers(self.export_part, self.report)
        self.job = job
        c = job.cluster
        self.sock = self.bind(zmq.ROUTER, c.endpoint(f"ps-{index}"), self.on_message)
        # read from the welcome on: a restarted shard's rows are the checkpoint's by then (the
        # keys and gradients queued for it meanwhile would go to an empty table, and be lost)
        self.pause(self.sock, True)
        self.slowdown = max(1.0, slowdown)
        self.skew = job.placement.mode == "skew"
        self.peers = {i: self.connect(zmq.DEALER, c.endpoint(f"ps-{i}"), sndhwm=0)
                      for i in range(c.shards) if i != index and self.skew}
        self.work = WindowLedger()            # work per window, until control recorded it
        self.version = 0                      # the key map this shard's rows follow
        self.moving: KeyMap | None = None     # a handover waiting for held batches' grads
        self.moving_since = 0.0
        self.received: dict[int, list[int]] = {}  # version -> [Handovers, keys] received
        self.sent_keys = 0
        self.moved_version = 0                # the last placement whose handover is complete
        t, e = job.train, job.embeddings
        self.layout = job.layout()
        self.admission = Admission(e.min_count, e.sketch_mb, len(self.layout.fields),
                                   e.expire_batches, e.expire_s, time.monotonic())
        self.expiry = Expiry(e.expire_batches, e.expire_s, e.max_rows_per_shard,
                             time.monotonic())
        self.table = EmbeddingTable(self.layout.row_dim, t.embedding_init, t.embedding_lr,
                                    seed=t.seed, defaults=self.admission.defaults,
                                    rowwise=t.embedding_optimizer == "rowwise_adagrad")
        self.held: dict[int, HeldBatch] = {}
        self.waiting: OrderedDict[int, list[tuple[bytes, bool]]] = OrderedDict()
        self.early_grads: OrderedDict[int, EmbeddingGrads] = OrderedDict()  # before keys
        self.applied = AppliedBatches()   # (bounded: roles.algorithms.shard.applied)
        self.answered_eval: OrderedDict[int, None] = OrderedDict()
        self.newest_epoch = 0
        self.counts = {"key_messages": 0, "lookups": 0, "rows_sent": 0, "updates": 0,
                       "duplicates_refused": 0,
                       "keys_received": 0, "keys_repeated": 0, "lookup_s": 0.0,
                       "update_s": 0.0, "keys_moved_out": 0, "keys_moved_in": 0,
                       "handovers": 0, "handovers_forced": 0, "checkpoints": 0,
                       "lookups_after_update": 0, "grads_without_keys": 0,
                       "held_dropped": 0}
        self.checkpoints = ShardCheckpoints(index, self.table, job.checkpoint.full_every)
        self.cut: Checkpoint | None = None   # a cut waiting for gradients on their way
        self.cut_since = 0.0
        self.applied_log: AppliedLog | None = None  # batches applied after each snapshot
        self.snapshot = 0    # the newest checkpoint snapshot taken (or restored)
        # live serving: the rows changed at each ServingCut, on a PUB of the shard's own
        self.rows = RowPublisher(index, self.table, job.serving.row_bytes) \
            if job.serving.publish_ms else None
        self.rows_pub = self.bind(zmq.PUB, c.endpoint(f"rows-{index}"), sndhwm=64) \
            if self.rows is not None else None

    def on_welcome(self) -> None:
        try:
            restored = self.restore_checkpoint()
        except (OSError, ValueError, KeyError, StorageError) as exc:
            self.fail(f"cannot restore the checkpoint {self.restore_dir}: {exc}")
            return
        self.store().discard_staged(self.checkpoints.own_files())
        self.applied_log = AppliedLog(Path(self.run_dir) / "applied" / self.node_id)
        number = restored.get("checkpoint", 0)
        if not self.rollback and restored and not self.applied_log.segments():
            # restored on a disk without the dead process's log (a new machine or pod): what
            # it applied after the checkpoint is lost, and cannot be counted
            restored["updates_lost"] = None
        elif not self.rollback:  # applied by a dead process after the checkpoint: lost
            lost = self.applied_log.lost(number, self.applied)
            if restored or lost:
                restored["updates_lost"] = len(lost)
        self.applied_log.restart(number)
        self.pause(self.sock, False)
        self.state = "ready"
        self.to_control(Ready(info={"keys": len(self.table), **restored}))

    # -- checkpoints -----------------------------------------------------------------------------
    def handle_cut(self, m: Checkpoint) -> None:
        """Checkpoint ``write``: once no training batch held still waits for its gradients,
        fork the writer (``roles.checkpoint.shard``). The feeders have drained (every batch
        is acknowledged), so gradients still to come are on their way; a batch that has none
        after ``[placement] drain_timeout_s`` will get none (its gradients went to this
        shard's dead process): it is dropped, counted, and the snapshot taken."""
        if self.cut is None or self.cut.number != m.number:
            self.cut, self.cut_since = m, time.monotonic()
        pending = self.awaiting_grads()
        if pending:
            if time.monotonic() - self.cut_since < self.job.placement.drain_timeout_s:
                return
            log.warning("checkpoint %d: %d held batch(es) never got gradients; dropped",
                        m.number, len(pending))
            self.drop_held(pending)
        self.cut = None
        waited = time.monotonic() - self.cut_since
        meta = {"updates": self.counts["updates"], "newest_epoch": self.newest_epoch,
                "version": self.version, "table": self.table_totals()}
        pause = self.checkpoints.begin(m.number, self.store(), self.applied, meta)
        self.snapshot = m.number
        self.counts["checkpoints"] += 1
        self.counts["checkpoint_pause_s"] = round(pause + waited, 6)
        self.report(Snapshotted(number=m.number, pause_s=round(pause + waited, 6),
                                waited_s=round(waited, 6)))
        if self.applied_log is not None:
            self.applied_log.start(m.number)
            complete = latest_complete(self.store())
            self.applied_log.prune(complete[0] if complete else 0)

    def store(self) -> Store:
        """Where this job's checkpoints go (``[checkpoint] dir``, else the run directory's)."""
        return checkpoint_store(self.job, self.run_dir)

    def restore_checkpoint(self) -> dict:
        """A restarted shard, or the whole job going back to a checkpoint: the table, the
        applied ids and where it stood, from the checkpoint control named ({} when none)."""
        manifest = read_manifest(self.restore_dir) if self.restore_dir else None
        files = (manifest or {}).get("parts", {}).get(self.node_id)
        if not files:
            return {}
        got = read_chain(Store(parent(self.restore_dir)), files)
        self.table.accept(got.keys, got.weights, got.accum)
        if got.default_weights is not None and got.default_accum is not None:
            self.table.restore_defaults(got.default_weights, got.default_accum)
        self.table.clear_dirty()
        self.table.forget_changes()   # servers join this process on the checkpoint
        self.checkpoints.restored(files)
        self.applied = AppliedBatches.restored(got.applied, got.applied_floors)
        meta = got.meta
        self.admission.restore_counts(meta.get("table", {}))
        self.expiry.restore_counts(meta.get("table", {}))
        self.newest_epoch, self.version = meta["newest_epoch"], meta["version"]
        self.snapshot = meta["number"]
        self.moved_version = self.version
        age = max(0.0, time.time() - meta["time"])
        log.warning("restored checkpoint %d of %.1f s ago: %d keys, %d updates (the updates "
                    "after it are %s)", meta["number"], age, len(self.table), meta["updates"],
                    "trained again" if self.rollback else "lost")
        self.counts["updates"] = meta["updates"]
        return {"restored": True, "checkpoint": meta["number"],
                "checkpoint_age_s": round(age, 3), "checkpoint_updates": meta["updates"]}

    def export_part(self, where: Path) -> tuple[str, list[str]]:
        """A snapshot of every row this shard holds (the export's embeddings-ps-<i>.npz),
        streamed from the table: no copy of it (the table does not change meanwhile: this
        runs in the shard's loop)."""
        where.mkdir(parents=True, exist_ok=True)
        t = self.table
        name = embeddings_file(self.index)
        size = save_embeddings(where / name, t.index, t.weights,
                               t.weights[:t.defaults] if t.defaults else None)
        log.info("exported %d rows to %s (%d bytes)", len(t), where / name, size)
        return self.node_id, [name]

    def on_message(self, identity: bytes | None, env) -> None:
        if identity is None:  # a ROUTER socket names the sender of every message
            raise ProtocolError("no_identity", "a message without its sender's identity")
        match env.msg:
            case BatchKeys() as msg:
                self.handle_keys(msg)
            case Lookup() as msg:
                self.handle_lookup(identity, msg)
            case Deliver() as msg:  # mode push: to the worker granted the batch, unasked
                self.handle_lookup(f"worker-{msg.worker}".encode(),
                                   Lookup(batch_id=msg.batch_id, train=msg.train))
            case EmbeddingGrads() as msg:
                self.handle_grads(msg)
            case GradsLookup() as msg:  # mode pull: the update first, then the next look-up
                grads, lookup = msg.parts()
                try:
                    self.handle_grads(grads)
                finally:  # answered even when the gradients are refused (ProtocolError)
                    self.handle_lookup(identity, lookup)
            case Handover() as msg if self.skew:
                self.handle_handover(msg)
            case RowsSince(checkpoint=k) if self.rows is not None:   # a serving process
                self.send(self.sock, self.rows.caught_up(k, self.snapshot), identity=identity)
            case _:
                self.unexpected(env, "shard socket")

    def handle_command(self, env) -> None:
        match env.msg:
            case Export() as m:
                self.exports.handle(m)
            case Checkpoint(phase="write") as m if m.number > self.checkpoints.written and (
                    self.checkpoints.writing is None or m.number > self.checkpoints.writing.number):
                self.handle_cut(m)
            case Placement(version=v, phase="move") as msg if self.skew and v > self.version \
                    and (self.moving is None or self.moving.version < v):
                self.moving = KeyMap.from_message(msg, self.job.cluster.shards,
                                                  self.job.placement.buckets_per_shard)
                self.moving_since = time.monotonic()
                self.try_handover()
            case ServingCut(number=n) if self.rows_pub is not None and self.state == "ready":
                assert self.rows is not None
                delta = self.rows.cut(n)
                if delta is not None:
                    self.send(self.rows_pub, delta)
            case _:
                pass

    # -- work accounting (the capacity predictor's records) ------------------------------------
    def worked(self, window: int, op: str, pairs: int, started: float) -> None:
        """Count a piece of work (``op``: lookup or update) begun at thread time ``started``."""
        took = time.thread_time() - started
        if self.slowdown > 1:
            self.rest((self.slowdown - 1) * took)  # a slower machine: busy for longer
            took *= self.slowdown
        self.work.add(window, op, pairs, took)
        self.counts[f"{op}_s"] += took

    def handle_keys(self, msg: BatchKeys) -> None:
        if msg.batch_id in self.held:
            self.counts["keys_repeated"] += 1
            return
        if msg.fields > len(self.layout.fields):   # its fields' default rows and widths
            raise ProtocolError("bad_fields", f"batch {msg.batch_id} has {msg.fields} fields' "
                                              f"runs, the job {len(self.layout.fields)}")
        started = time.thread_time()
        self._forget_old_epochs(split_batch_id(msg.batch_id)[0])
        mapping = self.admission.map_batch if msg.train else self.admission.map_eval
        mapped = mapping(self.table, msg.keys, msg.positions, msg.bounds)
        widths = None
        at = self.layout.widths_at(msg.positions, msg.bounds) if msg.train else None
        if at is not None:   # a key is one table's: any of its occurrences says its width
            widths = np.empty(len(mapped.rows), np.float32)
            widths[mapped.inverse] = at
        self.held[msg.batch_id] = HeldBatch(rows=mapped.rows, widths=widths,
                                            mask=Embeddings.mask_of(msg.positions, msg.grid),
                                            grid=msg.grid,
                                            inverse=mapped.inverse, window=msg.window,
                                            train=msg.train, pending=mapped.pending,
                                            fresh=mapped.fresh)
        self.worked(msg.window, "lookup", len(msg.keys), started)
        self.counts["key_messages"] += 1
        self.counts["keys_received"] += len(msg.keys)
        for identity, train in self.waiting.pop(msg.batch_id, []):
            self.answer(identity, msg.batch_id, train)
        early = self.early_grads.pop(msg.batch_id, None)
        if early is not None:
            self.handle_grads(early)

    def handle_lookup(self, identity: bytes, msg: Lookup) -> None:
        if msg.batch_id in self.held:
            self.answer(identity, msg.batch_id, msg.train)
            return
        if msg.train and msg.batch_id in self.applied:
            # a second copy's look-up (a straggler sent again, looked up when pulled) come
            # after the first copy's update: its keys are gone and will not come again, and
            # its worker is refused the batch; parked, it would wait for ever
            self.counts["lookups_after_update"] += 1
            return
        self.waiting.setdefault(msg.batch_id, []).append((identity, msg.train))
        while len(self.waiting) > MAX_WAITING:
            dropped, _ = self.waiting.popitem(last=False)
            self.reject(ProtocolError("lookup_dropped", f"batch {dropped} never got its keys"))

    def answer(self, identity: bytes, batch_id: int, train: bool) -> None:
        started = time.thread_time()
        held = self.held[batch_id]
        if not train:  # eval batches get no gradients: keep the newest few, in case a copy
            held.train = False                   # of the batch was sent again
            self.answered_eval[batch_id] = None
            while len(self.answered_eval) > MAX_EVAL_KEPT:
                self.held.pop(self.answered_eval.popitem(last=False)[0], None)
        rows = np.take(self.table.weights, held.rows, axis=0)
        if held.fresh is not None:
            rows[held.fresh[0]] = held.fresh[1]
        self.worked(held.window, "lookup", 0, started)
        self.send(self.sock, Embeddings(batch_id=batch_id, grid=held.grid, mask=held.mask,
                                        inverse=held.inverse, rows=rows), identity=identity)
        self.counts["lookups"] += 1
        self.counts["rows_sent"] += len(held.rows)

    def handle_grads(self, msg: EmbeddingGrads) -> None:
        if msg.batch_id in self.applied:
            self.counts["duplicates_refused"] += 1
            self.held.pop(msg.batch_id, None)
            return
        held = self.held.get(msg.batch_id)
        if held is None:  # its keys may still be on their way (sent again after a restart)
            self.early_grads[msg.batch_id] = msg
            while len(self.early_grads) > MAX_WAITING:
                dropped, _ = self.early_grads.popitem(last=False)
                self.counts["grads_without_keys"] += 1
                self.reject(ProtocolError("unknown_batch", f"gradients for batch {dropped}, "
                                                           "whose keys never came"))
            return
        if not held.train:  # its keys came as an evaluation batch's: rows may be stand-ins
            raise ProtocolError("eval_batch", f"gradients for evaluation batch {msg.batch_id}")
        if msg.grads.shape != (len(held.rows), self.table.dim):
            raise ProtocolError("bad_shape", f"gradients of shape {msg.grads.shape} for "
                                             f"{len(held.rows)} rows of {self.table.dim}")
        msg.require_finite()
        started = time.thread_time()
        del self.held[msg.batch_id]
        if self.applied_log is not None:
            self.applied_log.append(msg.batch_id)
        self.table.adagrad(held.rows, msg.grads, held.widths)
        self.admission.trained(held.pending)
        self.applied.add(msg.batch_id)
        self.counts["updates"] += 1
        self.worked(held.window, "update", len(held.inverse), started)
        if self.moving is not None:
            self.try_handover()
        if self.cut is not None:
            self.handle_cut(self.cut)

    # -- placement: handing rows over ----------------------------------------------------------
    def on_tick(self, now: float) -> None:
        super().on_tick(now)
        if self.moving is not None:
            self.try_handover()
        if self.cut is not None:
            self.handle_cut(self.cut)
        part = self.checkpoints.poll(self.store()) \
            if self.welcomed and self.checkpoints.writing is not None else None
        if part is not None:
            if not part.ok:
                log.error("checkpoint %d not written: %s", part.number, part.error)
            self.report(part)
        self.expiry.tick(self.table, now, self.held_rows)
        self.admission.tick(now)

    def held_rows(self) -> list[np.ndarray]:
        """The rows of every batch held (expiry and eviction must not drop them)."""
        return [h.table_rows() for h in self.held.values()]

    def try_handover(self) -> None:
        """Hand over the rows this shard no longer owns, once no held training batch still
        expects gradients (feeders have drained, so those are in flight), or after
        ``drain_timeout_s`` (their gradients will be refused; counted)."""
        keymap = self.moving
        if keymap is None:  # no placement to move to
            return
        pending = self.awaiting_grads()
        if pending:
            if time.monotonic() - self.moving_since < self.job.placement.drain_timeout_s:
                return
            log.warning("placement %d: %d held batch(es) never got gradients; handing over "
                        "without them", keymap.version, len(pending))
            self.counts["handovers_forced"] += 1
        self.moving = None
        self.held.clear()           # row numbers change below; nothing still needs them
        self.answered_eval.clear()
        keys, rows = self.table.index.items()
        leaving = np.zeros(self.table.size, dtype=bool)
        owner = keymap.owner_of(keys)
        leaving[rows[owner != self.index]] = True
        moved, weights, accum = self.table.release(leaving)
        owner = keymap.owner_of(moved)
        for peer, sock in self.peers.items():
            mine = owner == peer
            self.send(sock, Handover(version=keymap.version, keys=moved[mine],
                                     weights=weights[mine], accum=accum[mine]))
        self.version = keymap.version
        self.sent_keys = len(moved)
        self.counts["keys_moved_out"] += len(moved)
        self.counts["handovers"] += 1
        log.info("placement %d: handed %d keys over", keymap.version, len(moved))
        self.maybe_moved(keymap.version)

    def handle_handover(self, msg: Handover) -> None:
        if msg.version <= self.moved_version:
            return  # a repeat of a finished handover
        self.table.accept(msg.keys, msg.weights, msg.accum)
        got = self.received.setdefault(msg.version, [0, 0])
        got[0] += 1
        got[1] += len(msg.keys)
        self.counts["keys_moved_in"] += len(msg.keys)
        self.maybe_moved(msg.version)

    def maybe_moved(self, version: int) -> None:
        handovers, keys = self.received.get(version, (0, 0))
        if version == self.version and handovers == len(self.peers):
            self.report(Moved(version=version, sent=self.sent_keys, received=keys))
            self.received.pop(version, None)
            self.moved_version = version

    def _forget_old_epochs(self, epoch: int) -> None:
        if epoch > self.newest_epoch:
            self.newest_epoch = epoch
            self.applied.forget_epochs_before(epoch - 1)
            # keys of an applied batch are held (a part fed again by another feeder after its
            # feeder died trains it again; its gradients are then refused as duplicates), but
            # a straggler's copy, refused to its worker, gets none: its held keys would wait
            # for ever, and once its id leaves the applied set above, hold up every snapshot.
            # An epoch begins once the one before it is acknowledged: a training batch held
            # from before that gets no gradients now
            self.drop_held([b for b, h in self.held.items()
                            if h.train and split_batch_id(b)[0] < epoch - 1])

    def awaiting_grads(self) -> list[int]:
        """The training batches held whose gradients have not been applied."""
        return [b for b, h in self.held.items() if h.train and b not in self.applied]

    def drop_held(self, batch_ids: list[int]) -> None:
        for b in batch_ids:
            del self.held[b]
        self.counts["held_dropped"] += len(batch_ids)

    def counters(self) -> dict:
        # gradients whose keys never came (a restarted shard: their keys went to the dead
        # process, and the batch was acknowledged before the feeder sent them again): not
        # applied, lost; those still waiting count, as at the job's end they are
        lost = self.counts["grads_without_keys"] + len(self.early_grads)
        # the console's "queue" of a shard: training batches waiting for their gradients and
        # look-ups waiting for their keys (answered eval batches kept for copies are apart)
        waiting_grads = sum(1 for h in self.held.values() if h.train)
        return {**self.counts, "grads_without_keys": lost, "keys": len(self.table),
                "held_batches": waiting_grads, "eval_kept": len(self.held) - waiting_grads,
                "table": self.table_counters(),
                "waiting_lookups": len(self.waiting), "placement_version": self.version,
                "slowdown": self.slowdown, **self.work.counters(),
                **(self.rows.counters() if self.rows is not None else {})}

    def close(self) -> None:
        stopped = self.checkpoints.close()
        if stopped is not None:
            log.info("%s: exiting while it wrote checkpoint %d: the writer is stopped (that "
                     "checkpoint cannot be completed now)", self.node_id, stopped)
        super().close()

    def release(self) -> None:
        self.checkpoints.abandon()   # a writer still under way dies with its parent
        if self.applied_log is not None:
            self.applied_log.close()
        super().release()

    # -- the work per window: the capacity predictor's records -----------------------------------
    def heartbeat(self, final: bool = False) -> None:
        """The heartbeat, then the finished windows' work (skew-aware placement)."""
        super().heartbeat(final)
        if self.skew:
            held = Counter(h.window for b, h in self.held.items()
                           if h.train and b not in self.applied)
            report = self.work.report(held)
            if report is not None:
                self.to_control(report)

    def handle_reply(self, env) -> None:
        match env.msg:
            case WorkRecorded() as m:
                self.work.answered(m)
            case _:
                super().handle_reply(env)

    def table_counters(self) -> dict:
        """Admission, expiry and eviction: what keeps the table bounded."""
        return {"rows": len(self.table), "free_rows": self.table.free_rows,
                "table_bytes": self.table.nbytes, **self.admission.counters(),
                **self.expiry.counters()}

    def table_totals(self) -> dict:
        """The counts a checkpoint keeps, so that a resumed job's go on from them."""
        return {**self.admission.counters(), **self.expiry.counters()}


def main() -> None:
    role_main(Shard)


if __name__ == "__main__":
    main()
