"""How the console writes figures (pure): sizes, rates, durations, gauges against a threshold,
and the order of the node table."""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text

from roles.algorithms.shared.progress import describe, seconds
from roles.protocol.status import CheckpointView, Final, NodeRow, TaskFigures, Wait

DASH = "-"
STATE_STYLE = {"alive": ("● alive", "green"), "suspect": ("? suspect", "bold yellow"),
               "failed": ("✗ failed", "bold red"), "left": ("○ left", "dim")}


def size(n: float | None) -> str:
    """Bytes (or bytes per second), short: 512B, 3.4K, 120M, 2.1G."""
    if n is None:
        return DASH
    for unit in ("B", "K", "M", "G"):
        if abs(n) < 1024 or unit == "G":
            return f"{n:.0f}{unit}" if unit == "B" or n >= 100 else f"{n:.1f}{unit}"
        n /= 1024
    return DASH  # not reached


def count(n: float | None) -> str:
    """A count, short: 950, 12.3k, 4.5M."""
    if n is None:
        return DASH
    if abs(n) < 1000:
        return f"{n:.0f}"
    if abs(n) < 1_000_000:
        return f"{n / 1000:.1f}k"
    return f"{n / 1_000_000:.1f}M"


def ratio(r: float | None) -> str:
    """A ratio such as max/mean load: 1.23."""
    return DASH if r is None else f"{r:.2f}"


def duration(s: float | None) -> str:
    """Seconds, short: 45s, 3m20s, 2h05m."""
    return DASH if s is None else seconds(s, compact=True)


def age(s: float | None) -> str:
    return DASH if s is None else f"{s:.1f}s"


def state(value: str) -> Text:
    label, style = STATE_STYLE.get(value, (value, ""))
    return Text(label, style=style)


def gauge(value: float | None, limit: float, width: int = 30) -> Text:
    """A bar of ``value`` on a scale of 0..max(2 x limit, value), with the limit marked ``|``:
    green below the limit, red at or above it."""
    text = Text()
    if value is None:
        return Text("no figure yet", style="dim")
    scale = max(2 * limit, value, 1e-9)
    filled = min(width, round(value / scale * width))
    mark = min(width - 1, round(limit / scale * width))
    style = "bold red" if value >= limit else "green"
    for i in range(width):
        if i == mark:
            text.append("|", style="bold")
        elif i < filled:
            text.append("█", style=style)
        else:
            text.append("░", style="dim")
    return text


SORT_KEYS = ("role", "state", "cpu", "rss", "in_per_s", "out_per_s", "samples_per_s",
             "backlog", "round_samples", "beat_age_s")
ROLE_ORDER = {"control": 0, "feeder": 1, "aggregator": 2, "ps": 3, "worker": 4, "member": 5}
STATE_ORDER = {"failed": 0, "suspect": 1, "left": 2, "alive": 3}


def sort_nodes(rows: list[NodeRow], key: str) -> list[NodeRow]:
    """Rows in table order: by role then index, or by a figure (largest first; failed and
    suspect nodes first when sorting by state)."""
    def by_role(r: NodeRow) -> tuple[int, int]:
        return ROLE_ORDER.get(r["role"], 9), r["index"]

    if key == "role":
        return sorted(rows, key=by_role)
    if key == "state":
        return sorted(rows, key=lambda r: (STATE_ORDER.get(r["state"], 9), *by_role(r)))
    return sorted(rows, key=lambda r: (figure(r, key) is None, -(figure(r, key) or 0),
                                       *by_role(r)))


def figure(row: Mapping[str, object], name: str) -> float | None:
    """A row's figure by name (a node's cpu, rss, ...): None where it has none."""
    value = row.get(name)
    return float(value) if isinstance(value, (int, float)) else None


def elide(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, with … where it was cut."""
    return text if len(text) <= width else text[:width - 1] + "…"


def task_line(task: TaskFigures) -> str:
    """A long task's progress (``roles.algorithms.shared.progress``) in words."""
    return describe(task)


def wait_line(w: Wait) -> str:
    """``ps-1 to be restarted: start it with zbus-ps --index 1 --job ... (within 1m35s)``,
    ``worker-0 to start (within 2m58s)`` (no command: a supervisor is starting it)."""
    start = f": start it with {w['restart']}" if w["restart"] else ""
    return f"{w['node']} {w['what']}{start} (within {duration(w['left_s'])})"


def final_line(f: Final) -> Text:
    """How the job ended: ``completed: auc 0.9071, logloss 0.3012 in 45s; summary runs/...``."""
    ok = f.get("status") in ("completed", "stopped")
    text = Text(str(f.get("status")), style="bold green" if ok else "bold red")
    figures = []
    if f.get("auc") is not None:
        figures.append(f"auc {f['auc']:.4f}")
    if f.get("logloss") is not None:
        figures.append(f"logloss {f['logloss']:.4f}")
    if f.get("wall_s") is not None:
        figures.append(f"in {duration(f['wall_s'])}")
    if figures:
        text.append(": " + ", ".join(figures))
    if f.get("reason") and f.get("status") != "completed":
        text.append(f" ({f['reason']})")
    text.append(f"; summary {f.get('summary')}")
    return text


CUT_PHASES = {"drain": "draining", "flush": "flush round", "write": "snapshots",
              "resume": "writing the files"}


def checkpoint_line(k: CheckpointView) -> Text:
    """Whole-job checkpoints (the status's ``checkpoint``): ``3, 12s ago, 4.2M, training
    paused 0.050s; next in 48s`` or the cut under way, and a rollback on resume."""
    text = Text()
    latest, cut = k.get("latest"), k.get("under_way")
    if latest:
        text.append(f"{latest['number']}, {duration(latest.get('age_s'))} ago, "
                    f"{size(latest.get('bytes'))}")
        if latest.get("pause_s") is not None:
            text.append(f", training paused {latest['pause_s']:.3f}s")
    elif k.get("every_s"):
        text.append(f"none yet (every {duration(k['every_s'])})", style="dim")
    else:
        text.append("none yet (only when asked: every_s = 0)", style="dim")
    if cut:
        phase = CUT_PHASES.get(cut["phase"], cut["phase"])
        text.append(f"; {cut['number']} being cut ({phase}, "
                    f"{duration(cut['elapsed_s'])})", style="yellow")
    elif k.get("next_in_s") is not None:
        text.append(f"; next in {duration(k['next_in_s'])}", style="dim")
    aborted = k.get("last_aborted")
    if aborted and (not latest or aborted["number"] > latest["number"]) and not cut:
        text.append(f"; {aborted['number']} abandoned: {aborted['why']}", style="yellow")
    for r in (k.get("rollbacks") or [])[-1:]:
        text.append(f"; resumed from checkpoint {r['checkpoint']} (epoch {r['epoch'] + 1}, "
                    f"{count(r.get('retrained_samples'))} samples trained again)",
                    style="bold yellow")
    return text
