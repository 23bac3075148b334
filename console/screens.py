"""The console's dialogs: ``?`` help (every key, and what the node table's columns mean) and
the confirmation of live settings before they are sent."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

# every key of the main screen, in the order the help lists them (console.app binds them)
KEYS = (("1 2 3 4", "the tabs: Cluster, Nodes, Training, Partition"),
        ("s", "live settings (ctrl+s or Apply, then confirm; esc back)"),
        ("a", "aggregate now (sync modes every and lazy, while training)"),
        ("p", "pause / resume feeding"),
        ("b", "back up the dense weights now"),
        ("e", "export the model now"),
        ("c", "take a whole-job checkpoint now"),
        ("x x", "stop the job (a second x within 3 s confirms)"),
        ("o", "sort the node table by the next column (or click a header)"),
        ("↑ ↓", "select a node (Nodes tab): its history below the table"),
        ("?", "this help"),
        ("ctrl+p", "the command palette: every action by name"),
        ("q", "quit the console (the job goes on)"))
COLUMNS = (("state", "alive; suspect: silent 2.5 heartbeats or a probe late; failed; left"),
           ("cpu%", "CPU use, 100 = one core"),
           ("mem", "resident memory"),
           ("in/s out/s", "bus bytes per second through zbus sockets (not the NIC's)"),
           ("smp/s", "samples per second: workers trained, the feeder acknowledged; ▼ slow: "
                     "under half the median of the live nodes of its role"),
           ("queue", "feeder: batches in flight; worker: its pipeline; shard: batches held "
                     "and look-ups waiting"),
           ("M", "a worker's samples since its last contribution"),
           ("beat", "seconds since the node's last heartbeat; a failed or left node: how "
                    "long ago it was last heard (its figures -, not live)"),
           ("▲ ▼", "the sorted column and its order (o or a click on a header)"))


def help_text() -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for key, what in KEYS:
        table.add_row(key, what)
    table.add_row("", "")
    table.add_row(Text("node table", style="bold underline"), "")
    for column, what in COLUMNS:
        table.add_row(column, what)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static("zbus console: keys", id="help-title")
            with VerticalScroll():
                yield Static(help_text(), id="help-text")
            yield Static("esc, ? or q: close", classes="dim-line")

    def action_dismiss(self, result: None = None) -> None:  # type: ignore[override]
        self.dismiss(result)


class ConfirmScreen(ModalScreen[bool]):
    """What will be sent, and Apply or Cancel (enter / esc)."""

    BINDINGS = [Binding("escape,n", "answer(False)", "cancel"),
                Binding("enter,y", "answer(True)", "apply")]

    def __init__(self, changes: dict[str, tuple[object, str]]):
        super().__init__()
        self.changes = changes  # name -> (now, new)

    def compose(self) -> ComposeResult:
        lines = Text("apply these live settings?\n", style="bold")
        for name, (now, new) in self.changes.items():
            lines.append(f"  {name}: {now} → {new}\n")
        with Vertical(id="confirm-box"):
            yield Static(lines, id="confirm-text")
            with Horizontal(id="confirm-buttons"):
                yield Button("Apply", id="confirm-apply", variant="primary", compact=True)
                yield Button("Cancel", id="confirm-cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one("#confirm-apply", Button).focus()

    def action_answer(self, ok: bool) -> None:
        self.dismiss(ok)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm-apply")
