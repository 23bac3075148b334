"""How far a long task has got (pure): data indexing, the statistics pass, an export, an
epoch. A role keeps one ``Progress`` per task, updates it as work is done, puts
``Progress.figures`` into its heartbeat's counters (control shows them to consoles and serves
them to Prometheus) and logs ``Progress.line`` every ``Every.every_s`` seconds.

The rate is the average since the task started (work done ÷ time), the time left is what is
left at that rate; neither is known before some work is done."""

from __future__ import annotations

from dataclasses import dataclass

from roles.protocol.status import TaskFigures, TrainingView

UNITS = ("rows", "bytes", "parts", "samples")


def amount(value: float, unit: str) -> str:
    """A quantity of a unit, short: 1.2 GB, 340.5 kB, 12,345 rows."""
    if unit == "bytes":
        for scale, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if abs(value) >= scale:
                return f"{value / scale:.1f} {name}"
        return f"{value:.0f} B"
    return f"{value:,.0f} {unit}"


def seconds(s: float, compact: bool = False) -> str:
    """A duration, short: 45 s, 3 min 20 s, 2 h 05 min (``compact``: 45s, 3m20s, 2h05m)."""
    s = int(round(s))
    sep, minute = ("", "m") if compact else (" ", "min")
    if s < 60:
        return f"{s}{sep}s"
    if s < 3600:
        return f"{s // 60}{sep}{minute}{sep}{s % 60:02d}{sep}s"
    return f"{s // 3600}{sep}h{sep}{s % 3600 // 60:02d}{sep}{minute}"


@dataclass
class Progress:
    """``done`` of ``total`` (None: not known) ``unit`` of ``task``, started at ``started``
    (monotonic seconds)."""

    task: str
    unit: str
    total: float | None
    started: float
    done: float = 0.0
    at: float = 0.0     # when ``done`` was last updated

    def update(self, done: float, now: float, total: float | None = None) -> None:
        self.done, self.at = done, now
        if total is not None:
            self.total = total

    def rate(self, now: float) -> float | None:
        elapsed = now - self.started
        return self.done / elapsed if elapsed > 0 and self.done > 0 else None

    def eta_s(self, now: float) -> float | None:
        rate = self.rate(now)
        if rate is None or self.total is None:
            return None
        return max(0.0, (self.total - self.done) / rate)

    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, self.done / self.total)

    def figures(self, now: float) -> TaskFigures:
        """For heartbeats and the status: task, unit, done, total, rate (per second), eta_s,
        elapsed_s."""
        rate, eta = self.rate(now), self.eta_s(now)
        return {"task": self.task, "unit": self.unit, "done": round(self.done, 1),
                "total": None if self.total is None else round(self.total, 1),
                "rate": None if rate is None else round(rate, 1),
                "eta_s": None if eta is None else round(eta, 1),
                "elapsed_s": round(max(0.0, now - self.started), 1)}

    def line(self, now: float) -> str:
        """One log line: ``indexing: 120.0 MB of 800.0 MB (15%), 60.0 MB/s, 11 s left``."""
        return describe(self.figures(now))


def describe(f: TaskFigures) -> str:
    """``Progress.figures`` (as a heartbeat carried them: each figure read with care) in
    words."""
    unit = str(f.get("unit", ""))
    done = float(f.get("done") or 0)
    total = f.get("total")
    total = float(total) if isinstance(total, (int, float)) and total > 0 else None
    # a count's unit is said once (3 of 4 parts), a size's on both sides (1.2 MB of 4.0 MB)
    shown = amount(done, unit) if unit == "bytes" or total is None else f"{done:,.0f}"
    text = f"{f.get('task', 'work')}: {shown}"
    if total is not None:
        text += f" of {amount(total, unit)} ({min(1.0, done / total):.0%})"
    rate = f.get("rate")
    if isinstance(rate, (int, float)) and rate > 0:
        text += f", {amount(float(rate), unit)}/s"
    eta = f.get("eta_s")
    if isinstance(eta, (int, float)):
        text += f", {seconds(float(eta))} left"
    return text


class Every:
    """True once every ``every_s`` seconds: when to log again. The first call is due, or, with
    ``start``, the first call ``every_s`` after it (a task quicker than that logs nothing)."""

    def __init__(self, every_s: float, start: float | None = None):
        self.every_s = every_s
        self.next_at: float | None = None if start is None else start + every_s

    def due(self, now: float) -> bool:
        if self.next_at is not None and now < self.next_at:
            return False
        self.next_at = now + self.every_s
        return True


def epoch_line(t: TrainingView, epoch: int, epochs: int, rate: float) -> str:
    """The epoch's progress for the log, from the status's training figures
    (``roles.protocol.status.TrainingView``): ``epoch 3 of 20: 36,000 of 80,000 samples (45%),
    30,100 samples/s, epoch ends in 1 s, job in 35 s``."""
    done, total = int(t.get("epoch_samples") or 0), int(t.get("samples_per_epoch") or 0)
    text = f"epoch {epoch + 1} of {epochs}: {done:,} of {total:,} samples"
    if total:
        text += f" ({min(1.0, done / total):.0%})"
    text += f", {rate:,.0f} samples/s"
    eta_epoch, eta_job = t.get("eta_epoch_s"), t.get("eta_job_s")
    if isinstance(eta_epoch, (int, float)):
        text += f", epoch ends in {seconds(float(eta_epoch))}"
    if isinstance(eta_job, (int, float)):
        text += f", job in {seconds(float(eta_job))}"
    return text
