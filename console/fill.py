"""A bar of work done out of a total, and its percentage. Display only.

Textual's ``ProgressBar`` rounds its fill to the bar's width when the value is set: a value set
while its tab was not laid out kept a fill that the laid-out width does not round to, so the
same status drew the bar half a cell apart depending on when the tab was shown (the snapshot
tests caught it on a busy machine). ``FillBar`` keeps the share and draws it at the width it
has when it is drawn."""

from __future__ import annotations

from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import RenderResult
from textual.reactive import reactive
from textual.renderables.bar import Bar
from textual.widget import Widget

PERCENT_CELLS = 5


class FillBar(Widget, can_focus=False):
    COMPONENT_CLASSES = {"fill--bar", "fill--complete"}
    DEFAULT_CSS = """
    FillBar {
        width: 37;
        height: 1;
        &> .fill--bar { color: $primary; background: $surface; }
        &> .fill--complete { color: $success; background: $surface; }
    }
    """

    share: reactive[float | None] = reactive(None)

    def show(self, done: float, total: float) -> None:
        """``done`` of ``total`` (a total of 0 or less shows no share)."""
        self.share = min(1.0, max(0.0, done / total)) if total > 0 else None

    def render(self) -> RenderResult:
        width = max(0, self.size.width - PERCENT_CELLS)
        share = self.share
        style = self.get_component_rich_style(
            "fill--complete" if share is not None and share >= 1 else "fill--bar")
        bar = Bar(highlight_range=(0, width * (share or 0.0)),
                  highlight_style=Style.from_color(style.color),
                  background_style=Style.from_color(style.bgcolor), width=width)
        grid = Table.grid(padding=0)
        grid.add_column(width=width)
        grid.add_column(width=PERCENT_CELLS, justify="right")
        grid.add_row(bar, Text("--%" if share is None else f"{round(share * 100)}%"))
        return grid
