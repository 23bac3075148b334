"""``zbus-console``: the operator's terminal UI for a running job.

It talks only to control: a subscription to its status (``[cluster.endpoints] status``) and
its request endpoint (``control_req``), both taken from the job's cluster section (``--job``,
``ZBUS_JOB``, ``ZBUS_CLUSTER__*``) or given with ``--status`` / ``--requests``. So it works
the same beside ``honcho start`` and against a cluster on other hosts.

Keys (``?`` lists them, ``console.screens.KEYS``): 1-4 the tabs (cluster, nodes, training,
partition), s live settings, a aggregate now, p pause or resume feeding, b back up now,
e export now, c checkpoint now, x twice stop the job, o sort the node table by the next
column (or click a header), ? help, ctrl+p the command palette (every action by name), q quit.
Only the tab in view is laid out from each status; the Cluster and Nodes tabs keep their
history from every status.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable
from pathlib import Path

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static, TabbedContent, TabPane

from console import format as fmt
from console.bus import BusLink, Endpoints, LinkChanged, ReplyArrived, StatusArrived
from console.nodes import NodesPanel, NodeTable
from console.panels import ClusterPanel, PartitionPanel, TasksPanel
from console.screens import HelpScreen
from console.settings_screen import SettingsScreen
from console.training import TrainingPanel
from roles.protocol.status import StatusSnapshot

STOP_CONFIRM_S = 3.0
TabPanel = ClusterPanel | NodesPanel | TrainingPanel | PartitionPanel  # a tab's content
TABS = ("cluster", "nodes", "training", "partition")
TABS_GROUP = Binding.Group("tabs", compact=True)
# (title, help, action) of the command palette's zbus commands
COMMANDS = (("Aggregate now", "call an aggregation round (sync every, lazy)",
             "request('aggregate')"),
            ("Pause or resume feeding", "the feeders stop or restart sending batches",
             "pause"),
            ("Back up now", "the aggregator writes a backup of the dense weights",
             "request('backup')"),
            ("Export now", "export the model into the run directory", "request('export')"),
            ("Checkpoint now", "cut a whole-job checkpoint (zbus-control --resume goes back "
             "to the newest)", "request('checkpoint')"),
            ("Stop the job", "ends the job as stopped (asks to confirm)", "stop"),
            ("Live settings", "change the aggregation thresholds", "settings"),
            ("Sort the node table", "by the next column", "sort"),
            ("Help: keys", "every key of the console", "help"),
            *((f"Tab: {name}", f"show the {name} tab", f"tab('{name}')") for name in TABS))


class ZbusConsole(App):
    CSS_PATH = Path(__file__).with_name("console.tcss")  # absolute: subclasses live elsewhere
    TITLE = "zbus console"
    BINDINGS = [
        *(Binding(str(i + 1), f"tab('{name}')", name, group=TABS_GROUP)
          for i, name in enumerate(TABS)),
        # priority: s opens the settings before the keys typed after it are handed on, so a
        # burst reaches the settings' input (none goes to the screen below: 4 is a tab)
        Binding("s", "settings", "set", priority=True),
        Binding("a", "request('aggregate')", "round"),
        Binding("p", "pause", "pause"),
        Binding("b", "request('backup')", "backup"),
        Binding("e", "request('export')", "export"),
        Binding("c", "request('checkpoint')", "checkpoint", show=False),  # in ? help
        Binding("x", "stop", "stop"),
        Binding("o", "sort", "sort"),
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("escape", "hide_help_panel", "close keys", show=False),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, endpoints: Endpoints | None) -> None:
        """``endpoints`` None: no link (snapshot tests post the messages themselves)."""
        super().__init__()
        self.endpoints = endpoints
        self.link: BusLink | None = None
        self.snapshot: StatusSnapshot | None = None
        self.connected = False
        self.link_detail = "not connected"
        self.stop_armed_at = 0.0
        self.updates = 0  # snapshots shown (the console benchmark counts them)
        self.notice_until_status = False  # the notice says there is no status yet

    def compose(self) -> ComposeResult:
        yield Static(id="link-line")
        yield TasksPanel(id="tasks")
        with TabbedContent(initial="cluster", id="tabs"):
            with TabPane("Cluster", id="cluster"):
                yield ClusterPanel(id="cluster-panel")
            with TabPane("Nodes", id="nodes"):
                yield NodesPanel(id="nodes-panel")
            with TabPane("Training", id="training"):
                yield TrainingPanel(id="training-panel")
            with TabPane("Partition", id="partition"):
                yield PartitionPanel(id="partition-panel")
        yield Static("", id="notice")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one(TasksPanel).display = False
        self.show_link()
        if self.endpoints is not None:
            self.link = BusLink(self.endpoints, self.post_message)
            self.run_link(self.link)

    @work(exclusive=True, group="bus")
    async def run_link(self, link: BusLink) -> None:
        await link.run()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The palette (ctrl+p): every console action by name, then Textual's own but its
        "Keys" (its keys panel: the console's help, "Help: keys", lists every key)."""
        for title, help_text, action in COMMANDS:
            yield SystemCommand(title, help_text,
                                lambda action=action: self.run_action(action))
        yield from (c for c in super().get_system_commands(screen) if c.title != "Keys")


    # -- from the link -----------------------------------------------------------------------
    def closing(self) -> bool:
        """The app is shutting down: messages the link posted just before are dropped."""
        return not self.is_running or not self.screen_stack

    def on_status_arrived(self, message: StatusArrived) -> None:
        if self.closing():
            return
        snap = self.snapshot = message.snapshot
        self.query_one(ClusterPanel).record(snap)   # histories: from every status
        self.query_one(NodesPanel).record(snap)
        self.query_one(TasksPanel).show(snap)
        self.show_tab()
        if isinstance(self.screen, SettingsScreen):
            self.screen.show_status(snap["settings"])
        if self.notice_until_status:
            self.notice("")
        self.show_link()
        self.updates += 1

    def on_link_changed(self, message: LinkChanged) -> None:
        if self.closing():
            return
        self.connected, self.link_detail = message.connected, message.detail
        self.show_link()

    def on_reply_arrived(self, message: ReplyArrived) -> None:
        if self.closing():
            return
        screen = self.screen
        if isinstance(screen, SettingsScreen) and message.action == "set":
            screen.show_result(message.ok, message.text)
            if message.settings:
                screen.show_effective(message.settings, applied=message.ok)
        self.notice(f"{message.action}: " + (message.text if message.ok
                                             else f"refused: {message.text}"),
                    "ok" if message.ok else "refused")

    def show_link(self) -> None:
        """The top line, one line at any width (``console.format.top_line``)."""
        line = self.query_one("#link-line", Static)
        kind, text = fmt.top_line(self.snapshot, self.connected, self.link_detail,
                                  max(20, self.size.width - 2))
        line.set_classes(kind)
        line.update(text)

    def on_resize(self) -> None:
        self.show_link()

    def notice(self, text: str, kind: str = "", *, until_status: bool = False,
               for_s: float | None = None) -> None:
        """The line above the key bar; ``until_status``: cleared by the next status (it says
        there is none); ``for_s``: cleared after so long (an offer that expires)."""
        widget = self.query_one("#notice", Static)
        widget.set_classes(kind)
        widget.update(text)
        self.notice_until_status = until_status
        if for_s is not None:
            def expire() -> None:
                if widget.content == text:
                    self.notice("")
            self.set_timer(for_s, expire)

    # -- actions -------------------------------------------------------------------------------
    def send_request(self, action: str, changes: dict | None = None) -> None:
        if self.link is None:
            self.notice(f"{action}: not connected to control", "refused")
            return
        self.link.request(action, changes)

    def action_request(self, action: str) -> None:
        self.notice(f"{action}: asking control ...")
        self.send_request(action)

    def action_pause(self) -> None:
        paused = bool(self.snapshot and self.snapshot["paused"])
        self.action_request("resume" if paused else "pause")

    def action_stop(self) -> None:
        now = time.monotonic()
        if now - self.stop_armed_at > STOP_CONFIRM_S:
            self.stop_armed_at = now
            self.notice("press x again within 3 s to stop the job", "refused",
                        for_s=STOP_CONFIRM_S)
            return
        self.stop_armed_at = 0.0
        self.action_request("stop")

    def action_settings(self) -> None:
        if self.snapshot is None:
            self.notice("settings: no status from control yet", "refused", until_status=True)
            return
        self.push_screen(SettingsScreen(self.snapshot["settings"], self.send_request))

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_tab(self, name: str) -> None:
        self.query_one(TabbedContent).active = name

    def show_tab(self) -> None:
        """Only the tab in view is laid out (a status at 32 nodes costs a table and charts
        otherwise hidden); a tab coming into view is laid out at once."""
        if self.snapshot is not None:
            active = self.query_one(TabbedContent).active or "cluster"
            panels: dict[str, type[TabPanel]] = {
                "cluster": ClusterPanel, "nodes": NodesPanel, "training": TrainingPanel,
                "partition": PartitionPanel}
            panel = panels.get(active, ClusterPanel)
            self.query_one(panel).show(self.snapshot)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.show_tab()
        if event.pane.id == "nodes":  # the arrow keys select a node at once
            self.query_one(NodeTable).focus()

    def action_sort(self) -> None:
        table = self.query_one(NodeTable)
        key = table.cycle_sort()
        self.notice(f"nodes sorted by {key} {fmt.sort_direction(key)}")
        if self.snapshot:
            table.show(self.snapshot["nodes"])

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        if not isinstance(event.data_table, NodeTable):
            return
        key = event.data_table.columns_shown()[event.column_index][1]
        if key in fmt.SORT_KEYS:
            event.data_table.sort_by = key
            self.notice(f"nodes sorted by {key} {fmt.sort_direction(key)}")
            if self.snapshot:
                event.data_table.show(self.snapshot["nodes"])


def endpoints_from_args(argv: list[str] | None) -> Endpoints:
    parser = argparse.ArgumentParser(prog="zbus-console", description=__doc__.splitlines()[0],
                                     epilog="Keys: press ? in the console.")
    parser.add_argument("--job", help="job file (default: $ZBUS_JOB, else the built-in job)")
    parser.add_argument("--status", help="control's status endpoint (default: from the job)")
    parser.add_argument("--requests", help="control's request endpoint (default: from the job)")
    args = parser.parse_args(argv)
    if args.status and args.requests:
        return Endpoints(args.status, args.requests)
    from roles.job.cli import load_job_or_exit  # only when the job file has to say

    cluster = load_job_or_exit(args.job, "console").cluster
    return Endpoints(args.status or cluster.endpoint("status"),
                     args.requests or cluster.endpoint("control_req"), cluster)


def main(argv: list[str] | None = None) -> None:
    ZbusConsole(endpoints_from_args(argv)).run()


if __name__ == "__main__":
    main()
