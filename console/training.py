"""The Training tab: the epoch's progress and ETAs, then charts of the training loss and
samples per second over the job's time, and of each epoch's eval AUC beside a table of the
epochs; a stream job's line, and its lag and progressive AUC (the newest window's and every
event's) over time in place of the epochs'. Display only."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from console import format as fmt
from console.charts import Chart, robust_limits, series
from console.fill import FillBar
from roles.protocol.status import EpochFigures, StatusSnapshot, StreamView


class TrainingPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static(id="epoch-line")
        yield FillBar(id="epoch-progress")
        yield Static(id="throughput-line")
        with Horizontal(classes="chart-row"):
            yield Chart("training loss", "s since start", id="loss-plot")
            yield Chart("samples/s", "s since start", id="speed-plot", ytext=fmt.count)
        with Horizontal(classes="chart-row"):
            yield Chart("eval AUC", "epoch", id="auc-plot", whole_x=True)
            yield EpochsTable(id="epochs-table")
            yield Chart("progressive AUC", "s since start", id="progressive-plot")

    def show(self, snap: StatusSnapshot) -> None:
        t = snap["training"]
        epoch = snap["epoch"]
        stream = snap.get("stream")
        shown = f"epoch {epoch + 1} of {snap['epochs']}" if epoch >= 0 else "not started"
        if stream is not None:
            self.query_one("#epoch-line", Static).update(stream_line(stream, snap["phase"]))
        else:
            self.query_one("#epoch-line", Static).update(
                f"{shown}   phase {snap['phase']}   ETA epoch "
                f"{fmt.duration(t['eta_epoch_s'])}, job {fmt.duration(t['eta_job_s'])}")
        bar = self.query_one("#epoch-progress", FillBar)
        bar.display = stream is None   # a stream has no epoch to be part way through
        bar.show(t["epoch_samples"], max(1, t["samples_per_epoch"]))
        h = t["history"]
        losses = [x for x in h["loss"] if x is not None]
        last = f"{losses[-1]:.4f}" if losses else fmt.DASH
        self.query_one("#throughput-line", Static).update(
            f"throughput {fmt.count(t['samples_per_s'])} samples/s   trained "
            f"{fmt.count(t['samples_acked'])} samples   loss now {last}")
        self.query_one("#loss-plot", Chart).show(
            [series("loss", h["t"], h["loss"])], ylim=robust_limits(losses),
            note="the loss of each interval's acknowledged samples")
        self.query_one("#speed-plot", Chart).show(
            [series("samples/s", h["t"], h["samples_per_s"])])
        self.query_one(EpochsTable).display = stream is None
        self.query_one("#progressive-plot", Chart).display = stream is not None
        if stream is not None:   # the lag, and the progressive AUC, in place of the epochs'
            sh = stream["history"]
            self.query_one("#auc-plot", Chart).show(
                [series("lag (events)", sh["t"], sh["lag_events"])],
                title="stream lag, events" + ("  GROWING" if stream["growing"] else ""),
                note="the broker has not said its lag yet", xlabel="s since start",
                whole_x=False)
            by_task = stream["task_history"]
            self.query_one("#progressive-plot", Chart).show(
                [series(f"{name} window", sh["t"], values) for name, values in by_task.items()]
                if by_task else
                [series("window", sh["t"], sh.get("window_auc", [])),
                 series("every event", sh["t"], sh.get("progressive_auc", []))],
                note="no window of events scored yet")
            return
        done = [(e["epoch"] + 1, e["auc"]) for e in t["epochs"] if e["auc"] is not None]
        self.query_one("#auc-plot", Chart).show(
            [series("auc", [x for x, _ in done], [y for _, y in done])],
            title="eval AUC", note="no epoch evaluated yet", xlabel="epoch", whole_x=True)
        self.query_one(EpochsTable).show(t["epochs"])


def stream_line(stream: StreamView, phase: str) -> Text:
    """A stream job's line: events trained, the lag (red while it grows), the progressive
    AUC."""
    lag = fmt.DASH if stream["lag_events"] is None else fmt.count(stream["lag_events"])
    lag_s = fmt.DASH if stream["lag_s"] is None else f"{stream['lag_s']:.1f} s"
    aucs = [r["progressive_auc"] for r in stream["feeders"] if r["progressive_auc"] is not None]
    auc = f"{min(aucs):.4f}" if len(aucs) == 1 else (
        f"{min(aucs):.4f}–{max(aucs):.4f}" if aucs else fmt.DASH)
    if stream["tasks"]:   # several labels: each one's (the lowest feeder's)
        auc = ", ".join(f"{name} {_auc(f['progressive_auc'])}"
                        for name, f in stream["tasks"].items())
    down = any(r["broker_down_since"] is not None for r in stream["feeders"])
    text = Text(f"stream   phase {phase}   {fmt.count(stream['events_trained'])} events "
                "trained   ")
    text.append(f"lag {lag} events ({lag_s})",
                style="bold red" if stream["growing"] or down else "")
    if down:
        text.append("   broker unreachable", style="bold red")
    refused = sum(r.get("acks_refused", 0) for r in stream["feeders"])
    if refused:   # their messages come again, and what was trained of them is trained twice
        text.append(f"   {fmt.count(refused)} acks refused", style="yellow")
    text.append(f"   progressive AUC {auc}")
    return text


def _auc(value: float | None) -> str:
    return fmt.DASH if value is None else f"{value:.4f}"


class EpochsTable(Static):
    """The last epochs' figures, as many as its height holds."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.epochs: list[EpochFigures] = []

    def show(self, epochs: list[EpochFigures]) -> None:
        if epochs != self.epochs:
            self.epochs = list(epochs)
            self.refresh()

    def render(self) -> Text:
        return epochs_table(self.epochs, max(1, self.size.height - 1))


def epochs_table(epochs: list[EpochFigures], last: int = 12) -> Text:
    """The last epochs' figures, one line each; with several labels, each task's AUC and
    calibration after the first's (its figures are the eval auc and logloss)."""
    more = [t for t in (epochs[-1].get("tasks") or {})][1:] if epochs else []
    head = "".join(f"  {t[:10]:>10} auc  calib" for t in more)
    text = Text(f"epoch  train loss  eval auc  logloss{head}\n", style="bold")
    if not epochs:
        text.append("no epoch trained yet", style="dim")
    for e in epochs[-last:]:
        loss, auc, logloss = (fmt.DASH if v is None else f"{v:.4f}"
                              for v in (e["train_loss"], e["auc"], e["logloss"]))
        line = f"{e['epoch'] + 1:>5}  {loss:>10}  {auc:>8}  {logloss:>7}"
        for t in more:
            f = (e.get("tasks") or {}).get(t, {})
            a, c = (fmt.DASH if f.get(k) is None else f"{f[k]:.4f}"
                    for k in ("auc", "calibration"))
            line += f"  {a:>14}  {c:>5}"
        text.append(line + "\n")
    return text
