"""The aggregator: owner of the global dense weights, their backups and their export.

- sync ``step``: each StepGrad is applied at once with the aggregator's Adam and answered with
  the new weights (an asynchronous dense parameter server: no worker waits for another); the
  mode's part is ``roles.algorithms.sync.aggregator``;
- rounds (modes every, round and lazy, and the epoch-end round of step): control publishes
  Aggregate(r) with its participants; when each of them that is still a member (control's
  Membership: a worker that died or left is not waited for) has sent its Contribution for r,
  the new weights are the old ones plus the coefficient-weighted mean of the deltas received
  (``roles.algorithms.shared.aggregation``); they go out on PUB as Weights(r) and control hears
  RoundDone(r) with the samples each contributor trained. Rounds complete in order. A contribution
  marked ``done`` (its worker leaves) counts in its round; that worker gets no further weights.
- hierarchical (``[cluster] aggregators = K > 1``): aggregator i combines the workers whose
  index % K == i; aggregators 1..K-1 forward their Partial sums to aggregator 0, the root,
  which combines its own group and the partials, publishes, backs up and exports.
- backups (root): after each round, when the weights moved by ``backup_change_min`` (relative)
  since the last backup, and whenever an operator asks (BackupNow); written atomically, the
  newest ``backups_kept`` kept (``roles.checkpoint.model_files``). The initial weights are backup 0.
- recovery: a restarted root is told by control to Restore the latest backup; it publishes it
  as round r of a new generation, and workers replace their weights with it. A root whose disk
  no longer holds that backup (its pod made again elsewhere) restores the weights of the newest
  complete checkpoint (Welcome's ``restore``) instead.
- WeightsRequest is answered with the current weights (start-up, or a worker that missed some).
- checkpoints (root): at control's cut (Checkpoint ``write`` of round r, which this aggregator
  has combined) the weights, round, generation, step count and the step-mode Adam state are
  copied and written to ``checkpoints/<n>/dense.npz`` on a thread; when the whole job goes back
  to a checkpoint (Welcome ``rollback``) they are read back from it, and the backups of later
  rounds (the dead run's) removed.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
import zmq

from roles.algorithms.shared import live
from roles.algorithms.shared.aggregation import combine_partials, partial_sum
from roles.algorithms.sync import aggregator as sync_modes
from roles.checkpoint.background import ThreadWrite
from roles.checkpoint.files import (
    DENSE_PART,
    checkpoint_store,
    meta_array,
    number_name,
    read_meta,
    save_npz,
)
from roles.checkpoint.model_files import DENSE, Backups, ExportAnswers, load_dense, save_named
from roles.job.cli import role_main
from roles.job.settings import Job
from roles.model.network import build_network
from roles.protocol.checkpoint import Checkpoint, CheckpointPart, Snapshotted
from roles.protocol.dense_sync import (
    Aggregate,
    BackupNow,
    BackupWritten,
    Contribution,
    Partial,
    Restore,
    Restored,
    RoundDone,
    StepGrad,
    Weights,
    WeightsRequest,
)
from roles.protocol.lifecycle import Export, Membership
from roles.protocol.operator import Settings
from roles.protocol.serving import ServingCut
from roles.protocol.topology import ClusterConfig
from roles.serving.publishing import DensePublisher
from roles.storage.fs import StorageError
from roles.storage.store import Store
from zbus.codec import ProtocolError
from zbus.endpoints import node_index
from zbus.messages import Ready
from zbus.node import Node

log = logging.getLogger(__name__)


class Aggregator(Node):
    role = "aggregator"
    cluster: ClusterConfig  # the job's (the transport knows it only as a BusConfig)

    def __init__(self, job: Job, index: int = 0):
        super().__init__(job.cluster, index, job.fingerprint())
        self.exports = ExportAnswers(self.export_part, self.report)
        self.job = job
        c = job.cluster
        self.is_root = index == 0
        self.router = self.bind(zmq.ROUTER, c.aggregator_endpoint(index), self.on_peer)
        self.pub = self.bind(zmq.PUB, c.endpoint("aggregator_pub"), sndhwm=64) \
            if self.is_root else None
        # live serving: the dense weights at each ServingCut, on a PUB of their own
        serves = self.is_root and job.serving.publish_ms > 0
        self.dense = DensePublisher() if serves else None
        self.dense_pub = self.bind(zmq.PUB, c.endpoint("dense"), sndhwm=16) if serves else None
        self.up = None if self.is_root else self.connect(zmq.DEALER, c.aggregator_endpoint(0))
        model = build_network(job)
        self.layout = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
        with torch.no_grad():
            self.params = torch.cat([p.reshape(-1) for p in model.parameters()]) \
                .numpy().astype(np.float32)
        self.size = len(self.params)
        self.leaves = [f"aggregator-{i}" for i in range(1, c.aggregators)] if self.is_root else []
        self.sync = sync_modes.for_mode(job.train, self.size)
        self.settings = live.LiveValues(job.aggregation)
        self.round = 0
        self.steps = 0
        self.generation = 0
        self.expected: dict[int, list[str]] = {}
        self.members: set[str] | None = None
        self.received: dict[int, dict[str, Contribution]] = {}
        self.partials: dict[int, dict[str, Partial]] = {}
        self.done: set[str] = set()
        self.backups: Backups | None = None  # the root's, from its welcome on (``root_backups``)
        self.backup_request = 0
        self.counts = {"stale_contributions": 0, "refused_weights": 0, "partials": 0,
                       "restores": 0, "checkpoints": 0}
        self.cut: Checkpoint | None = None           # a cut of a round not combined yet
        self.writing: tuple[int, ThreadWrite, float] | None = None
        self.checkpointed = 0

    def on_welcome(self) -> None:
        info: dict = {}
        if self.is_root:
            backups = self.backups = Backups(Path(self.run_dir) / "backups")
            checkpoint_store(self.job, self.run_dir).discard_staged([f"*/{DENSE_PART}"])
            if self.rollback and self.restore_dir:
                try:
                    info = self.restore_checkpoint(self.restore_dir)
                except (OSError, ValueError, KeyError, StorageError) as exc:
                    self.fail(f"cannot restore the checkpoint {self.restore_dir}: {exc}")
                    return
            if not backups.existing():  # a first start: the initial weights are backup 0
                self.back_up(force=True)
        self.state = "ready"
        self.to_control(Ready(info={"parameters": self.size, "root": self.is_root, **info}))

    # -- checkpoints (root) ---------------------------------------------------------------------
    def handle_cut(self, m: Checkpoint) -> None:
        """Copy the state of the cut's round and write it on a thread."""
        if self.round < m.round:   # its round is still being combined: at its end
            self.cut = m
            return
        self.cut = None
        started = time.perf_counter()
        arrays = {"params": self.params.copy(), **self.sync.state(),
                  "meta": meta_array({"number": m.number, "round": self.round,
                                      "generation": self.generation, "steps": self.steps,
                                      "time": time.time()})}
        store = checkpoint_store(self.job, self.run_dir)
        name = f"{number_name(m.number)}/{DENSE_PART}"

        def write() -> int:   # on a thread: the file, then (a remote store) its upload
            size = save_npz(store.local(name), **arrays)
            store.publish([name])
            return size

        self.writing = (m.number, ThreadWrite(write), time.monotonic())
        self.checkpointed = m.number
        self.counts["checkpoints"] += 1
        self.report(Snapshotted(number=m.number, pause_s=round(time.perf_counter() - started,
                                                                6), waited_s=0.0))

    def poll_checkpoint(self) -> None:
        if self.writing is None or (result := self.writing[1].done()) is None:
            return
        number, writer, began = self.writing
        self.writing = None
        ok, error = result
        name = f"{number_name(number)}/{DENSE_PART}"
        size = int(writer.value) if ok else 0
        self.report(CheckpointPart(number=number, ok=ok, error=error,
                                   files=[name] if ok else [], bytes=size,
                                   write_s=round(time.monotonic() - began, 3),
                                   info={"round": self.round}))

    def restore_checkpoint(self, where: str) -> dict:
        """The whole job goes back to a checkpoint (its directory or URI): its weights, round,
        generation, steps and optimiser state; the backups of later rounds (the run that died)
        go."""
        with Store(where).open(DENSE_PART) as file, np.load(file) as f:
            meta = read_meta(f)
            params = f["params"].astype(np.float32)
            state = {k: f[k] for k in f.files if k not in ("params", "meta")}
        if params.shape != (self.size,):
            raise ValueError(f"{where}/{DENSE_PART} has {params.shape} weights, the model "
                             f"{self.size}")
        self.params, self.round = params, meta["round"]
        self.generation, self.steps = meta["generation"], meta["steps"]
        self.sync.load(state)
        self.checkpointed = meta["number"]
        backups = self.root_backups()
        dropped = backups.drop_after(self.round)
        backups.last = params.copy()
        log.warning("restored checkpoint %d (round %d); %d later backup(s) removed",
                    meta["number"], self.round, dropped)
        return {"checkpoint": meta["number"], "round": self.round}

    def weights(self) -> Weights:
        return Weights(round=self.round, step=self.steps, generation=self.generation,
                       params=self.params.copy())

    # -- messages from workers and group aggregators ----------------------------------------
    def on_peer(self, identity: bytes | None, env) -> None:
        if identity is None:  # a ROUTER socket names the sender of every message
            raise ProtocolError("no_identity", "a message without its sender's identity")
        peer = identity.decode(errors="replace")
        match env.msg:
            case WeightsRequest() if self.is_root:
                if peer in self.done:
                    self.counts["refused_weights"] += 1
                    return
                self.send(self.router, self.weights(), identity=identity)
            case StepGrad() as g if self.is_root:
                g.require_finite()  # refused before it changes anything (zbus.codec)
                self.params = self.sync.apply_step(self.params, g.grads)
                self.steps += 1
                self.send(self.router, self.weights(), identity=identity)
            case Contribution() as c:
                self.handle_contribution(peer, c)
            case Partial() as p if self.is_root and peer in self.leaves:
                p.require_finite()
                if p.round <= self.round:
                    self.counts["stale_contributions"] += 1
                    return
                if p.total.shape != (self.size,):
                    raise ProtocolError("bad_shape", f"partial sum of {p.total.shape}")
                self.partials.setdefault(p.round, {})[peer] = p
                self.counts["partials"] += 1
                self.complete_rounds()
            case _:
                self.unexpected(env, "aggregator socket")

    def handle_contribution(self, worker: str, c: Contribution) -> None:
        c.require_finite()  # refused before it changes anything (zbus.codec)
        if c.round <= self.round:
            self.counts["stale_contributions"] += 1
            return
        if c.delta.size not in (0, self.size):
            raise ProtocolError("bad_shape", f"delta of {c.delta.size} values, model has "
                                             f"{self.size}")
        if self.cluster.group_of(node_index(worker)) != self.index:
            raise ProtocolError("wrong_group", f"{worker} belongs to aggregator "
                                               f"{self.cluster.group_of(node_index(worker))}")
        self.received.setdefault(c.round, {})[worker] = c
        self.complete_rounds()

    # -- commands from control ----------------------------------------------------------------
    def handle_command(self, env) -> None:
        match env.msg:
            case Export() as m:
                self.exports.handle(m)
            case Aggregate(round=r, participants=who) if r > self.round:
                self.expected[r] = list(who)
                self.complete_rounds()
            case Membership(workers=workers):
                self.members = set(workers)
                self.complete_rounds()
            case Settings() as m:
                self.settings.take(m)
            case Restore() as r if r.generation > self.generation:
                self.restore(r)
            case BackupNow(request=n) if self.is_root and n > self.backup_request:
                self.backup_request = n
                self.back_up(force=True)
            case Checkpoint(phase="write") as m if self.is_root and m.number > self.checkpointed:
                self.handle_cut(m)
            case ServingCut(number=n) if self.dense_pub is not None and self.state == "ready":
                assert self.dense is not None
                delta = self.dense.cut(n, self.round, self.steps, self.generation, self.params)
                if delta is not None:
                    self.send(self.dense_pub, delta)
            case _:
                pass

    def missing(self, r: int, who: list[str]) -> tuple[list[str], list[str]]:
        """What round ``r`` of participants ``who`` still waits for: the contributions of this
        group's participants that are still members, and the leaves' partial sums."""
        got = self.received.get(r, {})
        workers = [w for w in who if self.cluster.group_of(node_index(w)) == self.index
                   and w not in got and (self.members is None or w in self.members)]
        leaves = [leaf for leaf in self.leaves if leaf not in self.partials.get(r, {})]
        return workers, leaves

    def group_ready(self, r: int, who: list[str]) -> bool:
        workers, leaves = self.missing(r, who)
        return not workers and not leaves

    def complete_rounds(self) -> None:
        while True:
            r = self.round + 1
            who = self.expected.get(r)
            if who is None or not self.group_ready(r, who):
                return
            got = {w: c for w, c in self.received.get(r, {}).items() if w in who or c.done}
            total, coefficient = partial_sum([c.delta for c in got.values()],
                                             [c.coefficient for c in got.values()], self.size)
            contributors, samples_by = list(got), [c.samples for c in got.values()]
            done = [w for w, c in got.items() if c.done]
            partials = self.partials.get(r, {})
            self.round = r
            self.forget_through(r)
            if self.up is not None:  # a group aggregator: its partial sum goes to the root
                self.send(self.up, Partial(round=r, contributors=contributors,
                                           samples_by=samples_by, done=done,
                                           coefficient=coefficient, samples=sum(samples_by),
                                           total=total))
                continue
            parts = [(total, coefficient)]
            for p in partials.values():
                parts.append((p.total, p.coefficient))
                contributors += p.contributors
                samples_by += p.samples_by
                coefficient += p.coefficient
                done += p.done
            self.params = self.params + combine_partials(parts, self.size)
            self.done.update(done)
            self.publish(self.weights())
            self.report(RoundDone(round=r, contributors=contributors,
                                      samples_by=samples_by, coefficient=coefficient,
                                      samples=sum(samples_by)))
            self.back_up()
            if self.cut is not None:
                self.handle_cut(self.cut)

    def forget_through(self, r: int) -> None:
        for table in (self.expected, self.received, self.partials):
            for old in [k for k in table if k <= r]:
                del table[old]

    # -- backups, recovery, export --------------------------------------------------------------
    def root_backups(self) -> Backups:
        """The root's backups (made at its welcome, once the run directory is known)."""
        if self.backups is None:
            raise RuntimeError(f"{self.node_id} keeps no backups: only the root does, once "
                               "welcomed")
        return self.backups

    def publish(self, weights: Weights) -> None:
        """The root's weights out on PUB."""
        if self.pub is None:
            raise RuntimeError(f"{self.node_id} publishes no weights: only the root does")
        self.send(self.pub, weights)

    def back_up(self, force: bool = False) -> None:
        backups = self.root_backups()
        due, change = backups.due(self.params, self.settings["backup_change_min"])
        if not (due or force):
            return
        path = backups.write(self.params, self.round, self.generation, change,
                             self.settings["backups_kept"])
        log.debug("backup after round %d: %s (change %.3f)", self.round, path.name, change)
        self.to_control(BackupWritten(round=self.round, path=str(path),
                                      change=change if np.isfinite(change) else -1.0))

    def restore(self, r: Restore) -> None:
        self.generation = r.generation
        self.forget_through(r.round)
        if self.up is not None and self.moved(self.up):   # the root made again elsewhere
            self.up = self.renew(self.up)
        if self.is_root:
            backups = self.root_backups()
            on_disk = backups.existing()
            path = Path(r.path) if r.path else on_disk[-1]
            if path.exists():
                params, meta = load_dense(path)
            elif self.restore_dir:   # a new pod's empty disk: the newest checkpoint's weights
                with Store(self.restore_dir).open(DENSE_PART) as file, np.load(file) as f:
                    params, meta = f["params"].astype(np.float32), read_meta(f)
                log.warning("backup %s is not on this disk (the pod was made again on another "
                            "host): restoring the weights of checkpoint %s instead, older",
                            path, self.restore_dir)
                path = Path(DENSE_PART)   # (said as the checkpoint's part)
            else:
                self.fail(f"cannot restore the weights: backup {path} is not on this disk and "
                          "the job has no complete checkpoint")
                return
            if params.shape != (self.size,):
                self.fail(f"backup {path} has {params.shape} weights, the model "
                          f"{self.size}")
                return
            self.params = params
            backups.last = params.copy()
            log.warning("restored %s (round %s) as round %d", path, meta.get("round"),
                        r.round)
        self.round = r.round
        self.counts["restores"] += 1
        if self.is_root:
            self.publish(self.weights())
            self.report(Restored(generation=r.generation, round=r.round))
        self.complete_rounds()

    def export_part(self, where: Path) -> tuple[str, list[str]] | None:
        if not self.is_root:
            return None
        where.mkdir(parents=True, exist_ok=True)
        tensors, offset = {}, 0
        for name, shape in self.layout:
            n = int(np.prod(shape))
            tensors[name] = self.params[offset:offset + n].reshape(shape)
            offset += n
        save_named(where / DENSE, tensors)
        return "dense", [DENSE]

    def on_tick(self, now: float) -> None:
        super().on_tick(now)
        self.poll_checkpoint()

    def counters(self) -> dict:
        return {**self.counts, "round": self.round, "steps": self.steps,
                "parameters": self.size, "generation": self.generation,
                "backups": self.backups.written if self.backups else 0,
                "waiting_for": self.waiting_for()}

    def waiting_for(self) -> dict | None:
        """The next round, once called, and what it still waits for (``missing``)."""
        r = self.round + 1
        who = self.expected.get(r)
        if who is None:
            return None
        workers, leaves = self.missing(r, who)
        return {"round": r, "workers": workers, "aggregators": leaves}


def main() -> None:
    role_main(Aggregator)


if __name__ == "__main__":
    main()
