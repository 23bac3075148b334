"""The feeder's ledger side (``LedgerSide``): the batches in flight
(``roles.algorithms.feeding.ledger.Ledger``), the workers' takes, grants and acks, the ack log,
the membership of workers, a restarted feeder's reclaiming and the copies for idle workers.

A worker asks to take the next batch it will run (Taken -> Grant): each batch is granted to one
worker, and only that worker's ack counts. In mode ``push`` (``[train] embeddings``) the grant
also tells every shard to send the batch's embeddings to that worker (Deliver): the worker
asks no shard for them. When control's membership loses a worker, its
batches and every batch not yet taken are sent again under the same id; at the end of a pass,
an idle worker gets second copies of batches still untaken elsewhere (see the Ledger).
A feeder killed and started again on its run resumes from its ack log and reclaims the batches
its dead process had sent (``roles.algorithms.feeding.reclaim``). With ``[checkpoint] dir`` set
the log is kept in the store too (``roles.checkpoint.stored_acks``): a feeder started on an
empty disk (its pod made again elsewhere) resumes from that copy, and no new batch goes out
while more acks than the workers keep for it are missing from the copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from roles.algorithms.feeding.ack_log import AckLog, seed
from roles.algorithms.feeding.ledger import InFlight, Ledger, PartProgress
from roles.algorithms.feeding.passes import Pass
from roles.algorithms.feeding.reclaim import Reclaim
from roles.algorithms.feeding.tally import FeederTally
from roles.algorithms.sync.feeder import FeederSync
from roles.checkpoint.stored_acks import StoredAcks
from roles.data.stream import Samples
from roles.job.settings import Job
from roles.protocol.datapath import Ack, Deliver, Grant, Grants, max_in_flight, split_batch_id
from zbus.codec import Message, ProtocolError
from zbus.endpoints import node_index

log = logging.getLogger(__name__)
COMPACT_EVERY = 65_536   # a stream's acks taken into the log's totals this often (2 MiB)


class LedgerSide:
    """``plan`` says the pass under way (None between passes); ``to_worker`` answers a worker
    on the ledger socket, ``to_shards`` sends every shard a message, ``pause_acks`` stops (True)
    or resumes reading the ledger socket, ``pump`` sends what can be sent; ``started``: when
    the process started; ``reclaimed``: called with a batch its dead process had sent that a
    restarted feeder takes back for a worker to train (its keys may be due again)."""

    def __init__(self, job: Job, tally: FeederTally, sync: FeederSync,
                 plan: Callable[[], Pass | None],
                 to_worker: Callable[[bytes, Message], None],
                 to_shards: Callable[[Message], None], pause_acks: Callable[[bool], None],
                 pump: Callable[[], None], started: float,
                 reclaimed: Callable[[int, InFlight], None] = lambda batch_id, entry: None):
        self.job, self.tally, self.sync, self.plan = job, tally, sync, plan
        self.to_worker, self.to_shards = to_worker, to_shards
        self.pause_acks, self.pump = pause_acks, pump
        self.reclaimed = reclaimed
        self.started = started
        self.ledger = Ledger(self.in_flight_limit(job.cluster.workers))
        self.push = job.train.embeddings == "push"  # grants tell the shards (Deliver)
        self.members: set[str] = set()
        self.members_version = -1
        self.copies_wanted = 0  # second copies of untaken batches that idle workers could use
        self.repeated_takes = 0  # a worker's Taken for a batch granted to it already
        self.first_acked = False
        # a feeder killed and started again resumes from its ack log
        # (roles.algorithms.feeding.ack_log)
        self.ack_log: AckLog | None = None
        self.stored: StoredAcks | None = None   # its copy in the checkpoint store, if any
        self.reclaim = Reclaim(self.ledger)
        self.rolled_back = False     # the whole job went back to a checkpoint: its log is it
        layout, group_by = job.layout(), job.metrics.group_by   # the GAUC's groups: a slot
        self.group_slot = layout.slot_range(layout.fields.index(group_by)).start \
            if group_by else None

    def in_flight_limit(self, workers: int) -> int:
        return max_in_flight(workers, self.job.train.prefetch)

    # -- the ack log -------------------------------------------------------------------------
    def open_ack_log(self, directory: Path, node_id: str, rolled_back: bool,
                     stored: StoredAcks | None = None) -> None:
        """Acknowledged training batches are logged; a log already there means this is a
        restart: the job-wide counts come back from it, and the ledger socket waits until the
        pass under way is rebuilt (the first EpochStart or Evaluate). ``stored``: the log's
        copy in the checkpoint store, from which a log missing here starts (the store cannot
        be read: StorageError, ValueError), and which a rolled-back log replaces at once."""
        self.ack_log = AckLog(directory, node_id)
        self.stored = stored
        if stored is not None and rolled_back:
            stored.write_now(self.ack_log)
        elif stored is not None and self.ack_log.restart() is None \
                and (position := stored.read()) is not None:
            self.ack_log.close()
            seed(directory, node_id, position)
            self.ack_log = AckLog(directory, node_id)
            log.warning("no ack log on this disk: it starts from its copy in %s",
                        stored.store.root)
        self.rolled_back = rolled_back
        done = self.ack_log.restart()
        if done is None:
            return
        self.tally.restore(done)
        if self.rolled_back:  # nothing was in flight at the cut: no worker holds a batch
            return
        self.reclaim.restart()
        self.pause_acks(True)
        log.warning("restarted: %d acknowledged batches (%d samples) in the ack log, the last "
                    "of epoch %d; resuming from there", done["batches"], done["samples"],
                    done["last_epoch"] + 1)  # epochs count from 1 in the log

    def log(self) -> AckLog:
        assert self.ack_log is not None, "the ack log is open from the welcome on"
        return self.ack_log

    def new_epoch(self, epoch: int) -> dict[int, PartProgress]:
        """The training pass of ``epoch`` begins: earlier epochs were reported (their totals
        suffice); where a restarted feeder's previous process, or the checkpoint rolled back
        to, had got to in this pass (nothing otherwise)."""
        self.log().fold(before=epoch)
        return self.log().progress(epoch) if self.reclaim.restarted or self.rolled_back else {}

    def pass_rebuilt(self) -> None:
        if self.reclaim.recovering:
            self.pause_acks(False)  # the workers' acks and Holding can be placed now

    # -- the workers -------------------------------------------------------------------------
    def newer_members(self, version: int) -> bool:
        return version > self.members_version

    def membership(self, version: int, workers: set[str]) -> None:
        lost = self.members - workers
        self.members, self.members_version = workers, version
        self.ledger.max_in_flight = self.in_flight_limit(len(workers))
        if lost:
            count = self.ledger.requeue(lost)
            log.warning("lost %s: %d batch(es) go out again", ", ".join(sorted(lost)), count)
        self.maybe_recovered()
        self.pump()

    def maybe_recovered(self) -> None:
        """Every live worker has sent what it holds of the dead process's batches: grant and
        send again (whatever nobody holds nor acknowledged goes out under its id)."""
        takes = self.reclaim.recovered(self.members if self.members_version >= 0 else None)
        if takes is None:
            return
        log.info("every worker has sent its acks and held batches: feeding resumes")
        for identity, batch_id in takes:
            self.grant(identity, batch_id)
        self.pump()

    # -- takes and acknowledgements ----------------------------------------------------------
    def taken(self, identity: bytes, batch_id: int) -> None:
        if self.reclaim.recovering:  # granted once every worker has answered
            self.reclaim.deferred_takes.append((identity, batch_id))
        else:
            self.grant(identity, batch_id)

    def taking(self, identity: bytes, batch_ids: list[int]) -> None:
        """Several takes in one message (Taking, AckTaking), in order: answered together
        (Grants), or, while restarted and recovering, deferred one by one like Taken."""
        if self.reclaim.recovering:
            self.reclaim.deferred_takes.extend((identity, b) for b in batch_ids)
            return
        answers = [(b, granted) for b in batch_ids
                   if (granted := self.decide(identity, b)) is not None]
        if answers:
            self.to_worker(identity, Grants(
                batch_ids=np.array([b for b, _ in answers], dtype=np.int64),
                granted=np.array([g for _, g in answers], dtype=np.uint8)))

    def grant(self, identity: bytes, batch_id: int) -> None:
        granted = self.decide(identity, batch_id)
        if granted is not None:
            self.to_worker(identity, Grant(batch_id=batch_id, granted=granted))

    def decide(self, identity: bytes, batch_id: int) -> bool | None:
        """Grant the batch to the worker or refuse it (None: not to answer). The caller sends
        the answer; in mode push, a granted batch's shards are told here (Deliver)."""
        worker = identity.decode(errors="replace")
        if self.ledger.holder(batch_id) == worker:
            # its Taken again: after a restart one can come queued for the dead process and
            # once more after FeederBack; the first was answered, and a second grant could
            # run a later copy of the batch twice, a refusal drop the batch the ledger counts
            self.repeated_takes += 1
            return None
        if batch_id not in self.ledger.in_flight:   # restarted: sent by its dead process?
            self.reclaim.taking(self.plan(), batch_id)
            self.took_back([batch_id])
        granted = self.ledger.take(batch_id, worker)
        entry = self.ledger.peek(batch_id)
        if granted and self.push and entry is not None and node_index(worker) >= 0:
            # the shards send its rows to the worker, unasked
            self.to_shards(Deliver(batch_id=batch_id, worker=node_index(worker),
                                   train=not entry.eval))
        return granted

    def holding(self, worker: str, held: list[int]) -> None:
        """A worker's batches granted by the dead process: they stay that worker's."""
        new = [b for b in held if b not in self.ledger.in_flight]
        self.reclaim.holding(self.plan(), worker, held)
        self.took_back(new)
        if self.reclaim.recovering:
            self.maybe_recovered()

    def took_back(self, batch_ids: list[int]) -> None:
        """Of these batches (none in flight before), those the dead process had sent and a
        worker now trains: ``reclaimed``."""
        for batch_id in batch_ids:
            entry = self.ledger.peek(batch_id)
            if entry is not None:
                self.reclaimed(batch_id, entry)

    def idle(self) -> None:
        """A worker has nothing to run: second copies of stragglers, if the pass is at its
        tail."""
        self.copies_wanted += self.job.train.prefetch + 1
        self.pump()

    def ack(self, worker: str, ack: Ack) -> bool:
        """A worker's ack, counted and logged; False when it is not the holder's (a duplicate
        or a lost worker's, counted in the ledger)."""
        plan = self.plan()
        sent = self.ledger.peek(ack.batch_id)
        reclaimed = self.reclaim.reclaimable(plan, ack.batch_id) if sent is None else None
        sent = sent or reclaimed
        if sent is not None and (ack.samples != len(sent.batch)
                                 or (sent.eval and ack.preds.shape != (sent.batch.labels.size,))):
            # rejected before the ledger forgets the batch: a bad ack must not lose it
            raise ProtocolError("inconsistent", f"ack of batch {ack.batch_id} does not match "
                                                f"the batch sent ({len(sent.batch)} samples)")
        if reclaimed is not None:  # acknowledged to the dead process, sent again by the worker
            self.reclaim.reclaim(plan, ack.batch_id, reclaimed, worker)
        entry = self.ledger.acked(ack.batch_id, worker)
        if entry is None:
            return False
        if entry.eval:
            self.tally.eval_acked(entry.batch.labels, ack.preds.reshape(entry.batch.labels.shape),
                                  None if self.group_slot is None
                                  else entry.batch.keys[:, self.group_slot])
        else:
            self.count(worker, ack)
        return True

    def count(self, worker: str, ack: Ack) -> None:
        """A training batch acknowledged: logged, then counted. (Also a batch a dead process
        of a stream feeder sent, which a worker trained: ``StreamSide.dead_acked``.)"""
        acks = self.log()
        acks.append(ack.batch_id, ack.samples, ack.loss_sum, ack.weight_sum,
                    max(0, node_index(worker)))
        if self.job.streaming and acks.appended % COMPACT_EVERY == 0:
            acks.compact(split_batch_id(ack.batch_id)[0])   # (a stream's one epoch)
        self.tally.train_acked(worker, ack.batch_id, ack.samples, ack.loss_sum,
                               ack.weight_sum)
        self.sync.acked(ack.samples)
        if not self.first_acked:
            self.first_acked = True
            log.info("first batch acknowledged: %.1f s after start",
                     time.monotonic() - self.started)

    # -- what goes out -----------------------------------------------------------------------
    def recovering(self) -> bool:
        """Restarted, and not every live worker has answered: nothing is granted nor sent."""
        return self.reclaim.recovering

    def has_room(self) -> bool:
        return self.ledger.has_room() and (
            self.stored is None or self.ack_log is None
            or self.stored.room(len(self.ledger.in_flight), self.ack_log))

    def store_acks(self, now: float) -> bool:
        """The log's copy in the store kept up (``StoredAcks.tick``): True when it moved on."""
        if self.stored is None or self.ack_log is None:
            return False
        return self.stored.tick(now, self.ack_log)

    def storing(self) -> bool:
        """The copy is being written while feeding waits for it."""
        return self.stored is not None and self.stored.busy() and not self.has_room()

    def in_flight(self) -> int:
        return len(self.ledger.in_flight)

    def batches_in_flight(self) -> list[tuple[int, Samples, bool]]:
        """Each batch in flight: its id, its samples and whether it is for evaluation."""
        return [(batch_id, entry.batch, entry.eval)
                for batch_id, entry in self.ledger.in_flight.items()]

    def no_copies(self) -> None:
        """Copies are for the end of a pass, when nothing is new."""
        self.copies_wanted = 0

    def again(self) -> tuple[int, InFlight] | None:
        """A batch to send again: one to resend, else a straggler's second copy if an idle
        worker could use one."""
        again = self.ledger.next_resend()
        if again is None and self.copies_wanted:
            again = self.ledger.straggler()
            self.copies_wanted = self.copies_wanted - 1 if again else 0
        return again

    def more_again(self) -> bool:
        """Batches wait to be sent again (or idle workers want copies)."""
        return bool(self.ledger.resend) or bool(self.copies_wanted)

    def sent(self, batch_id: int, batch: Samples, eval: bool, round_: int) -> None:
        self.ledger.sent(batch_id, batch, eval, round_)

    def unsent(self, batch_id: int) -> None:
        """The sample queue did not take the batch: it goes again first."""
        self.ledger.unsent(batch_id)

    # -- figures -----------------------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        ledger = self.ledger
        return {"requeued_batches": ledger.requeued, "duplicate_acks": ledger.duplicate_acks,
                "refused_takes": ledger.refused_takes, "repeated_takes": self.repeated_takes,
                "straggler_copies": ledger.straggler_copies,
                "max_in_flight": ledger.max_in_flight,
                **({"acks_stored": self.stored.stored, "ack_store_writes": self.stored.writes}
                   if self.stored is not None else {})}

    def restart_counters(self) -> dict[str, bool]:
        return {"restarted": self.reclaim.restarted, "recovering": self.reclaim.recovering}

    def close(self) -> None:
        if self.ack_log is not None:
            self.ack_log.close()
