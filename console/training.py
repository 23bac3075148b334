"""The Training tab: the epoch's progress and ETAs, then charts of the training loss and
samples per second over the job's time, and of each epoch's eval AUC. Display only."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import ProgressBar, Static

from console import format as fmt
from console.charts import Chart, robust_limits, series
from roles.protocol.status import EpochFigures, StatusSnapshot


class TrainingPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static(id="epoch-line")
        yield ProgressBar(total=100, show_eta=False, id="epoch-progress")
        yield Static(id="throughput-line")
        with Horizontal(classes="chart-row"):
            yield Chart("training loss", "s since start", id="loss-plot")
            yield Chart("samples/s", "s since start", id="speed-plot", ytext=fmt.count)
        with Horizontal(classes="chart-row"):
            yield Chart("eval AUC", "epoch", id="auc-plot", whole_x=True)
            yield EpochsTable(id="epochs-table")

    def show(self, snap: StatusSnapshot) -> None:
        t = snap["training"]
        epoch = snap["epoch"]
        shown = f"epoch {epoch + 1} of {snap['epochs']}" if epoch >= 0 else "not started"
        self.query_one("#epoch-line", Static).update(
            f"{shown}   phase {snap['phase']}   ETA epoch {fmt.duration(t['eta_epoch_s'])}, "
            f"job {fmt.duration(t['eta_job_s'])}")
        bar = self.query_one("#epoch-progress", ProgressBar)
        bar.update(total=max(1, t["samples_per_epoch"]),
                   progress=min(t["epoch_samples"], t["samples_per_epoch"]))
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
        done = [(e["epoch"] + 1, e["auc"]) for e in t["epochs"] if e["auc"] is not None]
        self.query_one("#auc-plot", Chart).show(
            [series("auc", [x for x, _ in done], [y for _, y in done])],
            note="no epoch evaluated yet")
        self.query_one(EpochsTable).show(t["epochs"])


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
    """The last epochs' figures, one line each."""
    text = Text("epoch  train loss  eval auc  logloss\n", style="bold")
    if not epochs:
        text.append("no epoch trained yet", style="dim")
    for e in epochs[-last:]:
        loss, auc, logloss = (fmt.DASH if v is None else f"{v:.4f}"
                              for v in (e["train_loss"], e["auc"], e["logloss"]))
        text.append(f"{e['epoch'] + 1:>5}  {loss:>10}  {auc:>8}  {logloss:>7}\n")
    return text
