"""Line charts with axes, a scale and labels (textual-plotext: Plotext drawn in a Textual
widget). A chart only displays: ``show`` gives it the series; it draws them when Textual
next paints it (a chart on a hidden tab is not drawn), and only when they changed.

A chart's first row is its title and its legend (``━ value  ━ max``, in the lines' colours),
outside the plot, so no series is hidden under it; its ticks are round numbers (1, 2 or 5
times a power of ten), as many as its size holds apart (a row between two on the y axis), or
the two ends of the range where no two round values fit."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot

from console import format as fmt

# (Plotext's colour, the same in Rich: Plotext's "orange" is the terminal's yellow)
COLORS = (("cyan", "cyan"), ("orange", "yellow"), ("green", "green"), ("magenta", "magenta"))
# rows a chart needs: its title and legend, the frame, three rows of plot, ticks and label
MIN_HEIGHT = 8
X_TICK_EVERY = 8  # columns per x tick at least (a label such as 116.5 and a space)


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


def nice_ticks(lo: float, hi: float, apart: float, *,
               cover: bool = False) -> tuple[list[float], list[str]]:
    """Round ticks between ``lo`` and ``hi``, at least ``apart`` of the range apart (0.5: at
    most three), the step 1, 2 or 5 times a power of ten, each label written with just the
    decimals the step needs (0, 0.1, 0.2, 0.3); the two ends when fewer than two round values
    lie between them. ``cover``: from the last tick at or below ``lo`` to the first at or
    above ``hi`` instead (an axis that then ends on a tick)."""
    if hi <= lo:
        hi = lo + 1.0
    least = (hi - lo) * apart
    power = 10.0 ** math.floor(math.log10(least))
    step = next(f * power for f in (1, 2, 5, 10) if f * power >= least * (1 - 1e-9))
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    if cover:
        first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    if last - first + 1 < 2:
        decimals = max(0, 1 - math.floor(math.log10(hi - lo)))
        return [lo, hi], [f"{lo:.{decimals}f}", f"{hi:.{decimals}f}"]
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    ticks = [round(k * step, decimals + 2) for k in range(first, last + 1)]
    return ticks, [f"{t:.{decimals}f}" for t in ticks]


class Chart(PlotextPlot):
    """One chart: a title, an x-axis label, one or more series, an optional y range and
    y-tick format (``ytext``: value -> label, e.g. bytes as 120M); ``from_zero``: the y axis
    starts at 0 (a rate against its threshold)."""

    def __init__(self, title: str, xlabel: str = "", *, id: str | None = None,
                 classes: str | None = None, ytext: Callable[[float], str] | None = None,
                 whole_x: bool = False, from_zero: bool = False):
        super().__init__(id=id, classes=classes)
        self.whole_x = whole_x  # x values are whole numbers (epochs): a tick at each
        self.from_zero = from_zero
        self.title = title
        self.xlabel = xlabel
        self.ytext = ytext
        self.lines: tuple[Series, ...] = ()
        self.ylim: tuple[float, float] | None = None
        self.note = ""
        self.shown = 0   # times the series changed (tests look at what is shown, not pixels)

    def show(self, lines: Sequence[Series], *, title: str | None = None,
             ylim: tuple[float, float] | None = None, note: str = "",
             xlabel: str | None = None, whole_x: bool | None = None) -> None:
        """The series (``title``, ``xlabel``, ``whole_x``: in place of the chart's own, for a
        chart that shows one thing or another: an epoch's AUC, or a stream's lag)."""
        lines, title = tuple(lines), self.title if title is None else title
        xlabel = self.xlabel if xlabel is None else xlabel
        whole_x = self.whole_x if whole_x is None else whole_x
        if (lines, title, ylim, note, xlabel, whole_x) == \
                (self.lines, self.title, self.ylim, self.note, self.xlabel, self.whole_x):
            return
        self.lines, self.title, self.ylim, self.note = lines, title, ylim, note
        self.xlabel, self.whole_x = xlabel, whole_x
        self.shown += 1
        self.refresh()

    def in_words(self) -> Text:
        """Too little room for axes: the title and each series' latest value, on two lines
        (one where there is only one), each cut to the width."""
        latest = [f"{s.label} {self.ytext(s.y[-1]) if self.ytext else f'{s.y[-1]:.3g}'}"
                  for s in self.lines if s.y]
        values = ", ".join(latest) or self.note or "no figure yet"
        lines = [self.title, values] if self.size.height >= 2 else [f"{self.title}: {values}"]
        text = Text(style="dim", no_wrap=True, overflow="ellipsis")
        for line in lines:
            text.append(fmt.elide(line, self.size.width) + "\n")
        text.rstrip()
        return text

    def legend(self, points: Sequence[Series]) -> Text:
        """The first row: the title and, for more than one series, each one's colour."""
        text = Text(self.title, style="bold")
        if len(points) > 1:
            for i, s in enumerate(points):
                text.append("  ━ ", style=COLORS[i % len(COLORS)][1])
                text.append(s.label)
        text.truncate(self.size.width, overflow="ellipsis")
        return text

    def render(self) -> RenderResult:
        if self.size.width < 12 or self.size.height < MIN_HEIGHT:
            return self.in_words()
        points = [s for s in self.lines if s.x]
        if not points:
            return Text(f"{self.title}\n{self.note or 'no figure yet'}", style="dim")
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.xlabel(self.xlabel)
        for i, s in enumerate(points):
            marker = "hd" if len(s.x) > 1 else "dot"
            plt.plot(list(s.x), list(s.y), color=COLORS[i % len(COLORS)][0], marker=marker)
        ys = [v for s in points for v in s.y]
        lo, hi = self.ylim if self.ylim is not None else (min(ys), max(ys))
        if self.from_zero:
            lo = min(0.0, lo)
        if hi <= lo:
            lo, hi = lo - (abs(lo) * 0.05 or 0.5), hi + (abs(hi) * 0.05 or 0.5)
        rows = self.size.height - 1 - 4   # less the legend, the frame, the ticks, the label
        # two rows apart at least (a row between two labels), six ticks at most
        yticks, ylabels = nice_ticks(lo, hi, max(2 / max(1, rows - 1), 1 / 5),
                                     cover=self.from_zero)
        if self.from_zero:
            hi = yticks[-1]   # 0 to a round value: the threshold's row reads off the ticks
        if self.ytext is not None:
            ylabels = [self.ytext(t) for t in yticks]
        plt.ylim(lo, hi)
        plt.yticks(yticks, ylabels)
        xs = sorted({x for s in points for x in s.x})
        if self.whole_x and len(xs) <= 12:
            plt.xticks(xs, [f"{x:.0f}" for x in xs])
        elif xs[-1] > xs[0]:
            margin = max(len(label) for label in ylabels) + 2
            width = max(1, self.size.width - margin)
            plt.xticks(*nice_ticks(xs[0], xs[-1], max(X_TICK_EVERY / width, 1 / 7)))
        self.plt.plotsize(self.size.width, self.size.height - 1)
        self.plt._set_size(self.size.width, self.size.height - 1)  # as PlotextPlot does
        self.plt.theme(self._get_plotext_theme_name(self.app.theme))
        return self.legend(points).append("\n").append_text(Text.from_ansi(self.plt.build()))
