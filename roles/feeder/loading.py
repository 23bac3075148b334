"""The feeder's data before its passes (``Loading``): opening it at start-up, indexing it
(feeder 0), the statistics pass, the dense transform; then it makes the streams of the parts.

The data is streamed (``roles.data``): feeder 0 indexes the files once (``roles.data.index``:
plain text files are not counted, only a few blocks of each read, their parts cut by bytes; the
lines of gzipped files are counted, cached) and tells control (DataIndex); control gives every
feeder its parts (PartMap). Each feeder then summarises its training parts' dense columns from
a bounded read (``roles.data.stats``: a sample of each part's first rows, only the columns it
needs parsed; PartStats), control merges them (DataStats), and every pass reads the feeder's
parts chunk by chunk through a shuffle buffer (``roles.data.stream``): its memory does
not grow with the data. How far indexing, then the statistics pass, has got goes to the log and
to the heartbeat's ``progress``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from roles.algorithms.feeding.ledger import PartProgress
from roles.algorithms.feeding.passes import Made, PartStream
from roles.algorithms.shared.metrics import oracle_aucs
from roles.algorithms.shared.progress import Every, Progress
from roles.checkpoint.model_files import TRANSFORM, write_json
from roles.data.held_parts import HeldParts
from roles.data.index import DataError, Part, exact_rows
from roles.data.rejected import RejectedRows
from roles.data.source import DataSource
from roles.data.statistics_pass import StatisticsPass
from roles.data.stream import Parsed, Preparer, Tally
from roles.data.transforms import DenseTransform
from roles.feeder.streams import PartStreams
from roles.job.settings import Job
from roles.protocol.datapath import DataIndex, DataStats, PartMap
from roles.protocol.status import TaskFigures
from zbus.codec import Message

log = logging.getLogger(__name__)
STATS_SLICE_S = 0.2   # the statistics pass works this long per turn of the loop
PROGRESS_LOG_S = 5.0  # data loading is logged this often


class Loading:
    """``keep_alive`` is called from inside indexing (the loop waits meanwhile), ``report``
    and ``to_control`` send control a report (kept for a restarted control) or a message,
    ``set_state`` sets the state the heartbeat shows."""

    def __init__(self, job: Job, index: int, keep_alive: Callable[[float], None],
                 report: Callable[[Message], None], to_control: Callable[[Message], None],
                 set_state: Callable[[str], None]):
        self.job, self.index = job, index
        self.keep_alive, self.report, self.to_control = keep_alive, report, to_control
        self.set_state = set_state
        self.source: DataSource | None = None
        self.rejected_rows: RejectedRows | None = None
        self.statistics: StatisticsPass | None = None  # this feeder's share of it
        self.streams: PartStreams | None = None
        self.transform: DenseTransform | None = None
        self.preparer: Preparer | None = None          # once control's DataStats are in
        self.progress: Progress | None = None          # indexing, then the statistics pass
        self.progress_log = Every(PROGRESS_LOG_S, 0.0)
        self.stream_opened = False   # a stream job's: no files (``open_stream``)

    # -- start-up ----------------------------------------------------------------------------
    def open(self, run_dir: Path, node_id: str) -> str | None:
        """Open the data; feeder 0 indexes it and tells control (DataIndex). What went wrong
        reading it, if anything (the feeder fails)."""
        started = time.monotonic()
        self.rejected_rows = RejectedRows(run_dir / "rejected.tsv",
                                          run_dir / "feeders" / f"{node_id}.rejected-parts")
        try:
            self.source = source = DataSource(self.job)
            self.statistics = StatisticsPass(source, self.job.data, len(self.job.dense_fields))
            self.streams = PartStreams(self.job, source, self.rejected_rows, self.held_parts())
            if self.index == 0:   # the index keeper
                self.set_state("indexing")
                files, parts, n_train = source.index(self.indexing(source))
                source.files = files
                oracle = source.oracle_scores(parts)
                self.report(DataIndex(n_train=n_train, oracle_aucs=[] if oracle is None
                                      else [-1.0 if a != a else a for a in oracle_aucs(*oracle)],
                                      body=PartMap.body_of(
                                          DataSource.describe(files)),
                                      parts=np.array([p.as_list() for p in parts],
                                                     dtype=np.int64).reshape(-1, 7)))
                what = "synthetic data" if source.synthetic else f"indexed {len(files)} file(s)"
                about = "" if all(exact_rows(f) for f in files) else "about "
                log.info("%s: %s%d rows in %d parts (%s%d training rows) in %.1f s", what,
                         about, sum(p.rows for p in parts), len(parts), about, n_train,
                         time.monotonic() - started)
        except (DataError, OSError) as exc:
            return f"cannot read the data: {exc}"
        self.progress = None
        return None

    def open_stream(self, run_dir: Path, node_id: str) -> None:
        """A stream job's data: no files; feeder 0 tells control there is one part per
        feeder, none for evaluation (the stream's own scores are progressive)."""
        self.rejected_rows = RejectedRows(run_dir / "rejected.tsv",
                                          run_dir / "feeders" / f"{node_id}.rejected-parts")
        self.stream_opened = True
        if self.index == 0:
            feeders = self.job.cluster.feeders
            parts = [Part(i, 0, 0, 0).as_list() for i in range(feeders)]
            self.report(DataIndex(n_train=0, oracle_aucs=[], body=PartMap.body_of([]),
                                  parts=np.array(parts, dtype=np.int64).reshape(-1, 7)))

    def held_parts(self) -> HeldParts | None:
        """The parts held between passes: only when a part is read more than once."""
        d, layout = self.job.data, self.job.layout()
        if self.job.train.epochs < 2 or d.hold_mb <= 0:
            return None
        return HeldParts(d.hold_mb, Parsed.row_bytes(layout.slots, len(self.job.dense_fields),
                                                     len(self.job.tasks), bool(d.weight)))

    def hold_ahead(self, parts: list[Part]) -> None:
        """Begin reading these parts now, to hold them, before a pass needs them (those that
        would not fit are left to their passes)."""
        assert self.streams is not None, "the data is open"
        queued = self.streams.hold_ahead(parts)
        if queued:
            log.info("reading %d part(s) ahead of their pass, to hold them", queued)

    def hold_only(self, parts: list[int]) -> None:
        """Hold no part but these (this feeder's, after a new PartMap)."""
        if self.streams is not None and self.streams.held is not None:
            self.streams.held.drop(parts)

    def held_counters(self) -> dict[str, float | int]:
        held = None if self.streams is None else self.streams.held
        return {} if held is None else held.counters()

    def indexing(self, source: DataSource) -> Callable[[int], None]:
        """Told of the bytes indexed (in the loop, which waits meanwhile): the progress goes
        to the log and, with the heartbeats still sent, to control."""
        started = time.monotonic()
        self.progress = progress = Progress("indexing the data", "bytes",
                                            source.data_bytes() or None, started)
        self.progress_log = Every(PROGRESS_LOG_S, started)

        def advance(count: int) -> None:
            now = time.monotonic()
            progress.update(progress.done + count, now)
            self.keep_alive(now)
            if self.progress_log.due(now):
                log.info("%s", progress.line(now))
        return advance

    def opened(self) -> bool:
        return self.source is not None or self.stream_opened

    def adopt(self, m: PartMap) -> None:
        """The files of control's first PartMap (raises DataError where they differ)."""
        if self.source is not None and not self.source.synthetic:
            self.source.adopt(m.files())

    # -- the statistics pass -----------------------------------------------------------------
    def want_statistics(self, mine: list[Part], training_parts: int) -> None:
        """Summarise this feeder's training parts (``mine``) of the ``training_parts``."""
        assert self.statistics is not None, "the data is open"
        self.statistics.want(mine, training_parts)
        whole = self.job.data.decay_base > 1.0
        self.progress = Progress("statistics of the data", "rows", sum(
            p.rows if whole else min(p.rows, self.statistics.sample) for p in mine) or None,
            time.monotonic())
        self.progress_log = Every(PROGRESS_LOG_S, time.monotonic())

    def summarising(self) -> bool:
        """The statistics pass has work left and control's DataStats are not in yet."""
        return self.statistics is not None and self.statistics.pending \
            and self.preparer is None

    def summarise(self, now: float) -> bool:
        """The statistics pass, a slice of time per turn of the loop (heartbeats go on);
        whether it has work left."""
        assert self.statistics is not None and self.rejected_rows is not None
        self.set_state("summarising")
        report = self.statistics.run(now + STATS_SLICE_S)
        if self.statistics.shown:
            self.rejected_rows.append(self.statistics.shown)
            self.statistics.shown = []
        if report is not None:
            self.to_control(report)
            self.rows_summarised(int(report.counts[:, 0].sum()), time.monotonic())
        return self.statistics.pending

    def rows_summarised(self, rows: int, now: float) -> None:
        """The statistics pass read ``rows`` more rows."""
        if self.progress is None:
            return
        self.progress.update(self.progress.done + rows, now)
        if self.progress_log.due(now):
            log.info("%s", self.progress.line(now))

    def take_stats(self, m: DataStats) -> None:
        """Control's merged statistics: the dense transform, the weighting, the preparer."""
        self.transform = DenseTransform(log1p=m.log1p, mean=np.array(m.mean),
                                        std=np.array(m.std))
        self.preparer = Preparer.for_job(self.job, self.transform,
                                         None if m.newest < 0 else m.newest)
        self.progress = None
        if self.statistics is not None:
            self.statistics.clear()
        self.set_state("ready")
        log.info("statistics of the training data in: %d rows read, %d rejected",
                 m.rows_read, m.rejected)

    def prepared(self) -> bool:
        """Control's statistics are in: batches can be made."""
        return self.preparer is not None

    def transform_json(self) -> dict[str, Any] | None:
        """The dense transform as written to a checkpoint and an export."""
        t = self.transform
        return None if t is None else {"dense": self.job.dense_fields, "log1p": t.log1p,
                                       "mean": t.mean.tolist(), "std": t.std.tolist()}

    def export_part(self, where: Path) -> tuple[str, list[str]] | None:
        """The dense transform, so that the export scores raw rows as training saw them."""
        transform = self.transform_json()
        if transform is None:
            return None
        where.mkdir(parents=True, exist_ok=True)
        write_json(where / TRANSFORM, transform)
        return "transform", [TRANSFORM]

    # -- the streams of the parts ------------------------------------------------------------
    def training(self, part: Part, epoch: int, progress: PartProgress, tally: Tally,
                 made: Made) -> PartStream:
        streams, preparer = self.ready()
        return streams.training(part, epoch, progress, preparer, tally, made)

    def evaluation(self, part: Part, tally: Tally) -> PartStream:
        streams, preparer = self.ready()
        return streams.evaluation(part, preparer, tally)

    def order(self, parts: list[int], epoch: int) -> list[int]:
        """The training parts in this epoch's order."""
        assert self.streams is not None, "the data is open"
        return self.streams.order(parts, epoch)

    def ready(self) -> tuple[PartStreams, Preparer]:
        assert self.streams is not None and self.preparer is not None, "no pass before stats"
        return self.streams, self.preparer

    # -- figures -----------------------------------------------------------------------------
    def bytes_read(self) -> int:
        return self.source.bytes_read if self.source is not None else 0

    def figures(self, now: float) -> TaskFigures | None:
        """How far indexing or the statistics pass has got (None: neither under way)."""
        return None if self.progress is None else self.progress.figures(now)

    def close(self) -> None:
        if self.streams is not None:
            self.streams.close()
