"""The Nodes tab: the table of every node, and below it the highlighted node's history (CPU,
memory, bus in and out over the last minutes). Display only: ``show`` lays out a status."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static

from console import format as fmt
from console.charts import Chart, series
from console.history import NodeHistory
from roles.protocol.status import NodeRow, StatusSnapshot

# (header, the row's key it shows and sorts by, shown in the narrow layout); the id names the
# role, so the role has no column of its own (sorting by role is the default order). The
# narrow layout's columns come first, in order, but for M.
NODE_COLUMNS = (("id", "role", True), ("state", "state", True), ("cpu%", "cpu", True),
                ("mem", "rss", True), ("in/s", "in_per_s", True),
                ("out/s", "out_per_s", True), ("smp/s", "samples_per_s", True),
                ("queue", "backlog", True), ("M", "round_samples", False),
                ("beat", "beat_age_s", True), ("doing", None, False),
                ("host:pid", None, False))
WIDE = 120   # columns from which the table shows every column (else the detail line does)
LEGEND = ("queue: feeder batches in flight · worker pipeline · shard batches held + look-ups "
          "waiting   M: samples since the last contribution   ↑↓ select a node")


def cells(r: NodeRow, wide: bool, slow: bool = False) -> list[Any]:
    """A node's row. A node gone (failed, left) shows dashes for its figures, which are no
    longer live, and how long ago it was last heard; a slow one its samples/s marked ▼."""
    figures: list[str | Text] = [fmt.count(r["cpu"]), fmt.size(r["rss"]), fmt.size(r["in_per_s"]),
               fmt.size(r["out_per_s"]), fmt.count(r["samples_per_s"]), fmt.count(r["backlog"])]
    if wide:
        figures.append(fmt.count(r["round_samples"]))
    beat: str | Text = fmt.age(r["beat_age_s"])
    if r["state"] in fmt.GONE:
        figures = [Text(fmt.DASH, style="dim")] * len(figures)
        beat = Text(f"{fmt.duration(r['beat_age_s'])} ago", style="dim")
    elif slow:
        figures[4] = Text(f"▼{figures[4]}", style="bold yellow")
    row = [r["id"], fmt.state(r["state"]), *figures, beat]
    if wide:
        row += [fmt.elide(r["doing"], 24), f"{r['host']}:{r['pid']}"]
    return row


class NodeTable(DataTable):
    """Every node control knows, one row each; ``sort_by`` names the figure rows are sorted
    by (a header click or the ``o`` key changes it). Narrower than ``WIDE`` columns, what a
    node is doing and its host:pid are in the detail line below the table instead."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.sort_by = "role"
        self.rows_shown: list[NodeRow] = []
        self.slow: dict[str, float] = {}  # slow nodes of the rows shown: their role's median
        self.wide: bool | None = None
        self.cells_shown: list[list[Any]] | None = None   # as shown, row by row
        self.headers_for: tuple[bool, str] | None = None   # (wide, sort_by) of the headers

    def columns_for(self, wide: bool) -> None:
        """The columns for the width, the sorted one's header marked ▲ or ▼ (its order)."""
        if (wide, self.sort_by) == self.headers_for:
            return
        self.wide, self.headers_for = wide, (wide, self.sort_by)
        self.cells_shown = None
        self.clear(columns=True)
        for label, key, _narrow in self.columns_shown():
            marker = f" {fmt.sort_direction(self.sort_by)}" if key == self.sort_by else ""
            self.add_column(label + marker, key=label)

    def columns_shown(self) -> list[tuple[str, str | None, bool]]:
        return [c for c in NODE_COLUMNS if self.wide or c[2]]

    def show(self, rows: list[NodeRow]) -> None:
        """The rows, sorted. The same nodes in the same order (the usual case): only the
        cells that changed are rewritten, which keeps a status with 32 nodes cheap to show;
        else the table is made again."""
        self.columns_for(self.wide if self.wide is not None else False)
        selected = self.selected()  # stays highlighted wherever the new order puts it
        before = [r["id"] for r in self.rows_shown]
        self.rows_shown = fmt.sort_nodes(rows, self.sort_by)
        ids = [r["id"] for r in self.rows_shown]
        self.slow = fmt.slow_nodes(rows)
        now = [cells(r, bool(self.wide), r["id"] in self.slow) for r in self.rows_shown]
        if ids == before and self.cells_shown is not None and self.row_count == len(ids) \
                and self.fits(now):
            labels = [c[0] for c in self.columns_shown()]
            for node, old, new in zip(ids, self.cells_shown, now, strict=True):
                for label, a, b in zip(labels, old, new, strict=True):
                    if a != b:
                        self.update_cell(node, label, b)
        else:
            self.clear()
            for node, row in zip(ids, now, strict=True):
                self.add_row(*row, key=node)
            if selected in ids:
                self.move_cursor(row=ids.index(selected), scroll=False)
        self.cells_shown = now

    def fits(self, rows: list[list[Any]]) -> bool:
        """Every cell fits its column as it is (else the table is made again, wider)."""
        widths = [c.content_width for c in self.ordered_columns]
        return all(len(str(cell)) <= width for row in rows
                   for cell, width in zip(row, widths, strict=False))

    def selected(self) -> str | None:
        if 0 <= self.cursor_row < len(self.rows_shown):
            return self.rows_shown[self.cursor_row]["id"]
        return None

    def cycle_sort(self) -> str:
        keys = fmt.SORT_KEYS
        self.sort_by = keys[(keys.index(self.sort_by) + 1) % len(keys)]
        return self.sort_by


class NodesPanel(Vertical):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history = NodeHistory()
        self.rows: list[NodeRow] = []
        self.turn = 0

    def compose(self) -> ComposeResult:
        yield NodeTable(id="node-table")
        yield Static(LEGEND, id="node-legend")
        yield Static(id="node-detail")
        with Horizontal(id="node-charts"):
            yield Chart("cpu %", "s", id="node-cpu")
            yield Chart("memory", "s", id="node-mem", ytext=fmt.size)
            yield Chart("bus bytes/s", "s", id="node-bus", ytext=fmt.size)

    def on_resize(self) -> None:
        table = self.query_one(NodeTable)
        wide = self.size.width >= WIDE
        if wide != table.wide:
            table.columns_for(wide)
            table.show(self.rows)

    def record(self, snap: StatusSnapshot) -> None:
        """Every status, shown or not: the nodes' history."""
        self.rows = snap["nodes"]
        self.history.add(snap)

    def show(self, snap: StatusSnapshot) -> None:
        """The tab is in view: the table, the selected node's line and (one of) its charts."""
        self.rows = snap["nodes"]
        self.query_one(NodeTable).show(self.rows)
        self.turn += 1
        self.show_detail(only=self.turn % 3)  # one chart per status: no frame draws all three

    def show_detail(self, only: int | None = None) -> None:
        """The selected node's line and charts (``only``: just that chart, by number)."""
        table = self.query_one(NodeTable)
        node = table.selected()
        row = next((r for r in self.rows if r["id"] == node), None)
        detail = self.query_one("#node-detail", Static)
        if node is None or row is None:
            detail.update(Text("no node selected", style="dim"))
            return
        parts: list = [(row["id"], "bold"), f"  {row['host']}:{row['pid']}  ",
                       fmt.state(row["state"])]
        if (median := table.slow.get(row["id"])) is not None:
            parts.append((f"  ▼ slow: under half the median {fmt.count(median)}",
                          "bold yellow"))
        parts.append(f"  doing {row['doing']}")
        if row.get("round_samples") is not None:
            parts.append(f"  M {fmt.count(row['round_samples'])}")
        if row["state"] in fmt.GONE:
            parts.append((f"  last heard {fmt.duration(row['beat_age_s'])} ago", "dim"))
        if row["progress"]:
            parts.append((f"  {fmt.task_line(row['progress'])}", "yellow"))
        detail.update(Text.assemble(*parts))
        times, _ = self.history.of(node, "cpu")
        charts = (("#node-cpu", f"{node} cpu %", (("cpu", "cpu"),)),
                  ("#node-mem", f"{node} memory", (("rss", "rss"),)),
                  ("#node-bus", f"{node} bus in/out", (("in", "in_per_s"),
                                                                ("out", "out_per_s"))))
        for number, (where, title, lines) in enumerate(charts):
            if only is None or number == only:
                self.query_one(where, Chart).show(
                    [series(label, times, self.history.of(node, key)[1])
                     for label, key in lines], title=title)

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.show_detail()
