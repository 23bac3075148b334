"""What a serving process serves: one model at one version (``Served``), and the rows of
requests scored together (``score``). A newer version replaces the whole object at once
(``roles.serving.following``), so a batch is scored by exactly one version, and its responses
name that version: never a torn model."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from roles.data.readers import RawBlock
from roles.data.stream import Preparer, Samples, Tally
from roles.data.transforms import DenseTransform
from roles.job.settings import Job
from roles.serving.inference import Signature, empty_row
from roles.serving.model import ExportedModel


def version_of(manifest: dict) -> str:
    """The version a model's answers name: its training round; a checkpoint's also its number
    (``round.number``), since a job may checkpoint twice in one round (a stream job in sync
    mode step, say) with other rows."""
    round_ = str(manifest.get("round", 0))
    return f"{round_}.{manifest['number']}" if "number" in manifest else round_


class Scorer(Protocol):
    """What a version scores with: a checkpoint's or an export's model, or a live version
    (``roles.serving.live.LiveModel``)."""

    job: Job
    transform: DenseTransform
    manifest: dict

    def score(self, keys: np.ndarray, dense: np.ndarray) -> np.ndarray: ...


@dataclass
class Served:
    """``model`` at ``version`` (``version_of`` its manifest), ``trained_at`` the
    wall-clock time its parameters were saved (what the version lag counts from)."""

    model: Scorer
    version: str
    trained_at: float | None = None
    loaded_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.signature = Signature.of(self.model.job)
        self.prepare = Preparer(self.model.job.layout(), self.model.transform, None)

    @classmethod
    def of(cls, model: ExportedModel) -> Served:
        m = model.manifest
        saved = m.get("created")   # the export's or the checkpoint's manifest, when written
        return cls(model, version_of(m), float(saved) if saved else None).warm()

    @property
    def round(self) -> int:
        return int(self.model.manifest.get("round", 0))

    def warm(self) -> Served:
        """Score one row of missing values, so that the first request does not pay for
        what a first call costs (measured: 1.4 s on the Adult export, against ~1 ms after)."""
        self.score([empty_row(self.signature)])
        return self

    def score(self, blocks: list[RawBlock]) -> list[np.ndarray]:
        """The probability of every row of each block, scored in one batch."""
        tally = Tally()
        samples = Samples.join([self.prepare(b, False, tally) for b in blocks])
        probabilities = self.model.score(samples.keys, samples.dense)
        bounds = np.cumsum([len(b) for b in blocks])[:-1]
        return np.split(probabilities, bounds)
