"""Line charts with axes, a scale and labels (textual-plotext: Plotext drawn in a Textual
widget). A chart only displays: ``show`` gives it the series; it draws them when Textual
next paints it (a chart on a hidden tab is not drawn), and only when they changed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot

COLORS = ("cyan", "orange", "green", "magenta")
MIN_HEIGHT = 7  # rows a chart needs for its title, frame, two rows of plot, ticks and label


@dataclass(frozen=True)
class Series:
    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]


def series(label: str, x: Sequence[float | None], y: Sequence[float | None]) -> Series:
    """The points where both coordinates are known."""
    pairs = [(a, b) for a, b in zip(x, y, strict=False) if a is not None and b is not None]
    return Series(label, tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))


def robust_limits(values: Sequence[float], upper_quantile: float = 0.95,
                  min_points: int = 20) -> tuple[float, float] | None:
    """A y range that a few early outliers do not flatten (the first interval's loss is far
    above the rest): from the lowest value to the ``upper_quantile`` of the values, with a
    margin; None (Plotext's own scale) when there are too few points or nothing to clip."""
    if len(values) < min_points:
        return None
    ordered = sorted(values)
    lo, hi = ordered[0], ordered[min(len(ordered) - 1, int(upper_quantile * len(ordered)))]
    if hi <= lo or hi >= ordered[-1]:
        return None
    margin = (hi - lo) * 0.08
    return lo - margin, hi + margin


class Chart(PlotextPlot):
    """One chart: a title, an x-axis label, one or more series, an optional y range and
    y-tick format (``ytext``: value -> label, e.g. bytes as 120M)."""

    def __init__(self, title: str, xlabel: str = "", *, id: str | None = None,
                 classes: str | None = None, ytext: Callable[[float], str] | None = None,
                 whole_x: bool = False):
        super().__init__(id=id, classes=classes)
        self.whole_x = whole_x  # x values are whole numbers (epochs): a tick at each
        self.title = title
        self.xlabel = xlabel
        self.ytext = ytext
        self.lines: tuple[Series, ...] = ()
        self.ylim: tuple[float, float] | None = None
        self.note = ""
        self.shown = 0   # times the series changed (tests look at what is shown, not pixels)

    def show(self, lines: Sequence[Series], *, title: str | None = None,
             ylim: tuple[float, float] | None = None, note: str = "") -> None:
        lines, title = tuple(lines), self.title if title is None else title
        if (lines, title, ylim, note) == (self.lines, self.title, self.ylim, self.note):
            return
        self.lines, self.title, self.ylim, self.note = lines, title, ylim, note
        self.shown += 1
        self.refresh()

    def in_words(self) -> Text:
        """Too little room for axes: the title and each series' latest value, one line."""
        latest = [f"{s.label} {self.ytext(s.y[-1]) if self.ytext else f'{s.y[-1]:.3g}'}"
                  for s in self.lines if s.y]
        return Text(f"{self.title}: {', '.join(latest) or self.note or 'no figure yet'}",
                    style="dim")

    def render(self) -> RenderResult:
        if self.size.width < 12 or self.size.height < MIN_HEIGHT:
            return self.in_words()
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        plt.xlabel(self.xlabel)
        points = [s for s in self.lines if s.x]
        if not points:
            return Text(f"{self.title}\n{self.note or 'no figure yet'}", style="dim")
        for i, s in enumerate(points):
            marker = "hd" if len(s.x) > 1 else "dot"
            plt.plot(list(s.x), list(s.y), label=s.label if len(points) > 1 else "",
                     color=COLORS[i % len(COLORS)], marker=marker)
        ys = [v for s in points for v in s.y]
        lo, hi = self.ylim if self.ylim is not None else (min(ys), max(ys))
        if hi <= lo:
            lo, hi = lo - (abs(lo) * 0.05 or 0.5), hi + (abs(hi) * 0.05 or 0.5)
        plt.ylim(lo, hi)
        if self.ytext is not None:
            count = max(2, min(5, (self.size.height - 5) // 2 + 1))  # a row apart at least
            ticks = [lo + (hi - lo) * k / (count - 1) for k in range(count)]
            plt.yticks(ticks, [self.ytext(t) for t in ticks])
        xs = sorted({x for s in points for x in s.x})
        if self.whole_x and len(xs) <= 12:
            plt.xticks(xs, [f"{x:.0f}" for x in xs])
        return super().render()
