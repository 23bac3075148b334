"""The live settings screen: every live threshold with control's effective value, its valid
range and an input for a new value. Validators mark a value out of range as it is typed; Apply
sends every changed value to control in one request anyway, because control is the authority:
it validates, applies all or nothing, broadcasts, and its answer (the new effective values, or
the refusal) is what the screen shows."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.validation import Integer, Number
from textual.widgets import Button, Footer, Input, Label, Static


class SettingsScreen(Screen):
    BINDINGS = [Binding("escape", "app.pop_screen", "back"),
                Binding("ctrl+s", "apply", "apply")]

    def __init__(self, settings: dict) -> None:
        super().__init__()
        self.settings = settings  # {"version", "values", "ranges"} from control's status

    def compose(self) -> ComposeResult:
        values, ranges = self.settings["values"], self.settings["ranges"]
        with Vertical(id="settings-box"):
            yield Static(f"live settings (version {self.settings['version']}): a new value "
                         "applies when control accepts it", id="settings-title")
            with VerticalScroll(id="settings-rows"):
                for name, r in ranges.items():
                    whole = r["type"] == "int"
                    check = (Integer if whole else Number)(
                        minimum=r["min"], maximum=r["max"],
                        failure_description=f"{name} must be in [{r['min']}, {r['max']}]")
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
        self.show_result(None, "sent to control: " + ", ".join(f"{k} = {v}"
                                                              for k, v in changes.items()))
        self.app.send_request("set", changes)

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

    def show_effective(self, values: dict, inputs_too: bool) -> None:
        """Control's effective values after a reply; the inputs follow them after a change
        was applied (after a refusal they keep what was typed, to be corrected)."""
        self.settings = {**self.settings, "values": dict(values)}
        for name, value in values.items():
            if name in self.settings["ranges"]:
                self.query_one(f"#now-{name}", Label).update(f"now {value}")
                if inputs_too:
                    self.query_one(f"#set-{name}", Input).value = str(value)
