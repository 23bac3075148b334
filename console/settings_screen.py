"""The live settings screen: every live threshold with control's effective value, its valid
range and an input for a new value. Validators mark a value out of range as it is typed; Apply
(or ctrl+s, or enter in an input) shows what will be sent and asks for a confirmation, then
sends every changed value to control in one request, because control is the authority: it
validates, applies all or nothing, broadcasts, and its answer (the new effective values, or
the refusal) is what the screen shows.

The first input has the focus when the screen opens. Statuses refresh the effective values
and the version as they come; an input is only rewritten when a change was applied and the
input still holds what was sent (what is being typed is never overwritten), and its cursor
then goes to the end of the text."""

from __future__ import annotations

from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.validation import Integer, Number
from textual.widgets import Button, Footer, Input, Label, Static

from console.screens import ConfirmScreen
from roles.protocol.status import SettingsView

# the app's request to control: (action, changes)
Request = Callable[[str, dict[str, str]], None]


class SettingsScreen(Screen):
    BINDINGS = [Binding("escape", "app.pop_screen", "back"),
                Binding("ctrl+s", "apply", "apply")]

    def __init__(self, settings: SettingsView, request: Request) -> None:
        super().__init__()
        self.settings = settings  # {"version", "values", "ranges"} from control's status
        self.request = request
        self.sent: dict[str, str] = {}   # the request in flight: name -> text sent

    def compose(self) -> ComposeResult:
        values, ranges = self.settings["values"], self.settings["ranges"]
        with Vertical(id="settings-box"):
            yield Static(self.title_text(), id="settings-title")
            with VerticalScroll(id="settings-rows"):
                for name, r in ranges.items():
                    whole = r["type"] == "int"
                    kind = "an integer" if whole else "a number"
                    check = (Integer if whole else Number)(
                        minimum=r["min"], maximum=r["max"],
                        failure_description=f"{name} must be {kind} in "
                                            f"[{r['min']}, {r['max']}]")
                    with Horizontal(classes="setting-row"):
                        yield Label(name, classes="setting-name")
                        yield Input(str(values.get(name, "")), id=f"set-{name}", compact=True,
                                    type="integer" if whole else "number",
                                    validators=[check], classes="setting-input")
                        yield Label(f"now {values.get(name)}", id=f"now-{name}",
                                    classes="setting-now")
                        yield Label(f"[{r['min']}, {r['max']}]", classes="setting-range")
            with Horizontal(id="settings-buttons"):
                yield Button("Apply", id="apply", variant="primary", compact=True)
                yield Button("Back", id="back", compact=True)
            yield Static("", id="settings-result")
        yield Footer()

    def title_text(self) -> str:
        return (f"live settings (version {self.settings['version']}): a new value applies "
                "when control accepts it")

    def on_mount(self) -> None:
        first = next(iter(self.settings["ranges"]), None)
        if first is not None:
            box = self.query_one(f"#set-{first}", Input)
            self.set_focus(box)  # now, not later (Widget.focus): keys typed on may come next
            box.cursor_position = len(box.value)

    def changes(self) -> dict[str, str]:
        """Inputs whose text differs from the effective value."""
        values = self.settings["values"]
        found = {}
        for name in self.settings["ranges"]:
            text = self.query_one(f"#set-{name}", Input).value.strip()
            if text and text != str(values.get(name)):
                found[name] = text
        return found

    def action_apply(self) -> None:
        changes = self.changes()
        if not changes:
            self.show_result(True, "nothing to change")
            return
        values = self.settings["values"]

        def answered(ok: bool | None) -> None:
            if ok:
                self.send(changes)
            else:
                self.show_result(None, "not sent")

        self.app.push_screen(ConfirmScreen({k: (values.get(k), v) for k, v in changes.items()}),
                             answered)

    def send(self, changes: dict[str, str]) -> None:
        self.sent = dict(changes)
        self.show_result(None, "sent to control: " + ", ".join(f"{k} = {v}"
                                                              for k, v in changes.items()))
        self.request("set", changes)

    def on_input_submitted(self, _event: Input.Submitted) -> None:
        self.action_apply()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            self.action_apply()
        else:
            self.app.pop_screen()

    def show_result(self, ok: bool | None, text: str) -> None:
        result = self.query_one("#settings-result", Static)
        result.set_classes("" if ok is None else ("ok" if ok else "refused"))
        result.update(text if ok is not False else f"refused: {text}")

    def show_status(self, settings: SettingsView) -> None:
        """A status from control: the effective values and the version (inputs untouched)."""
        if settings.get("version") == self.settings.get("version"):
            return
        self.settings = {**self.settings, "version": settings["version"],
                         "values": dict(settings["values"])}
        self.query_one("#settings-title", Static).update(self.title_text())
        for name, value in settings["values"].items():
            if name in self.settings["ranges"]:
                self.query_one(f"#now-{name}", Label).update(f"now {value}")

    def show_effective(self, values: dict, applied: bool) -> None:
        """Control's effective values after a reply. After a change was applied, an input
        that still holds what was sent shows the effective value (cursor at the end); after a
        refusal the inputs keep what was typed, to be corrected."""
        self.settings = {**self.settings, "values": dict(values)}
        if applied:
            self.settings["version"] = self.settings.get("version", 0) + 1
            self.query_one("#settings-title", Static).update(self.title_text())
        for name, value in values.items():
            if name not in self.settings["ranges"]:
                continue
            self.query_one(f"#now-{name}", Label).update(f"now {value}")
            box = self.query_one(f"#set-{name}", Input)
            if applied and name in self.sent and box.value.strip() == self.sent[name]:
                box.value = str(value)
                box.cursor_position = len(box.value)
        self.sent = {}
