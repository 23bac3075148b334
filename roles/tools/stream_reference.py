"""The one-process comparator of a stream job (``zbus-reference --events FILE``): the events of
``FILE`` (the file ``zbus-replay`` published, read with the job's ``[data]`` schema) in file
order, batch by batch, each batch scored by the model as it is and then trained on
(test-then-train), in one process with no communication: the same network, optimisers,
dense transform (the moments of the first ``[stream] warmup_events`` events) and batch size as
the stream job. Its progressive AUC and log loss are what the distributed job's are measured
against (docs/streams.md); its memory does not grow with the file (the blocks are streamed).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from functools import partial

import numpy as np

from roles.algorithms.shared.progressive import StreamProgress
from roles.data.readers import RawBlock
from roles.data.source import DataSource
from roles.data.stats import Moments
from roles.data.stream import Preparer, Samples
from roles.data.transforms import DenseTransform, signed_log1p
from roles.feeder.stream_side import event_samples
from roles.job.settings import Job
from roles.job.stream_settings import StreamConfig
from roles.model.network import set_threads


def file_job(job: Job, path: str) -> Job:
    """The stream job's schema and model over a file read whole, in file order."""
    return dataclasses.replace(job, stream=StreamConfig(),
                               data=dataclasses.replace(job.data, path=path))


def event_blocks(source: DataSource) -> Iterator[RawBlock]:
    files, parts, _ = source.index()
    source.files = files
    for part in sorted(parts, key=lambda p: (p.file, p.first_row, p.start)):
        yield from source.blocks(part)


def batches(blocks: Iterator[RawBlock], prepare: Callable[[RawBlock], Samples],
            size: int) -> Iterator[Samples]:
    """Prepared events cut into batches of ``size`` in order (the last one partial)."""
    waiting: list[Samples] = []
    held = 0
    for block in blocks:
        samples = prepare(block)
        waiting.append(samples)
        held += len(samples)
        while held >= size:
            joined = Samples.join(waiting) if len(waiting) > 1 else waiting[0]
            yield joined.take(slice(0, size))
            rest = joined.take(slice(size, None))
            waiting, held = ([rest] if len(rest) else []), len(rest)
    if held:
        yield Samples.join(waiting) if len(waiting) > 1 else waiting[0]


def warmup_transform(job: Job, source: DataSource) -> DenseTransform:
    """The dense transform of the first ``warmup_events`` events, as a stream job makes it."""
    moments, seen = Moments.empty(len(job.dense_fields)), 0
    for block in event_blocks(source):
        take = block.dense[:max(0, job.stream.warmup_events - seen)]
        if len(take):
            moments = moments.merge(Moments.of(signed_log1p(take) if job.data.log1p
                                               else take))
        seen += len(block)
        if seen >= job.stream.warmup_events:
            break
    return moments.transform(job.data.log1p)


def score_then_train(job: Job, path: str, threads: int = 0,
                     freeze_after: int | None = None) -> dict:
    """Progressive validation of the events of ``path`` in one process; with
    ``freeze_after``, trained on the batches that start before that many events only (every
    event is still scored): a model that stopped learning."""
    from roles.tools.reference import Reference
    set_threads(threads or 1)
    fjob = file_job(job, path)
    source = DataSource(fjob)
    transform = warmup_transform(job, source)
    prepare = partial(event_samples, Preparer(fjob.layout(), transform, None))  # no decay
    ref = Reference(fjob)
    progressive = StreamProgress(len(job.tasks), job.stream.window_events)
    started = time.perf_counter()
    events = 0
    for batch in batches(event_blocks(source), prepare, job.train.batch_size):
        progressive.add(batch.labels, ref.score(batch), np.zeros(len(batch)))
        if freeze_after is None or events < freeze_after:
            ref.train(batch)
        events += len(batch)
    seconds = time.perf_counter() - started
    summary = progressive.first.summary()
    return {"events": events, "seconds": seconds, "frozen_after": freeze_after,
            "events_per_s": events / seconds if seconds else None,
            "progressive_auc": summary["progressive_auc"],
            "progressive_logloss": summary["progressive_logloss"],
            "windows": summary["windows"],
            "tasks": progressive.tasks(job.tasks) if len(job.tasks) > 1 else None}
