"""How the console writes figures (pure): sizes, rates, durations, gauges against a threshold,
the top line fitted to the terminal's width, and the node table's order and flags (a node
gone, a worker slower than its peers)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from rich.text import Text

from roles.algorithms.shared.progress import describe, seconds
from roles.protocol.status import (
    CheckpointView,
    Final,
    NodeRow,
    StatusSnapshot,
    TaskFigures,
    Wait,
)

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


def sort_direction(key: str) -> str:
    """The sorted column's marker: ▲ by role (then index) or state (failed first), ▼ by a
    figure (largest first)."""
    return "▲" if key in ("role", "state") else "▼"


GONE = ("failed", "left")   # a node no longer heard: its last figures are not live
SLOW_SHARE = 0.5   # a node is slow under this share of its role's median samples/s


def slow_nodes(rows: Sequence[NodeRow]) -> dict[str, float]:
    """The nodes slower than their peers: of the live nodes of a role with samples/s (workers,
    feeders), at least two, those under ``SLOW_SHARE`` of the role's median; node -> that
    median."""
    by_role: dict[str, list[NodeRow]] = {}
    for r in rows:
        if r["state"] not in GONE and r.get("samples_per_s") is not None:
            by_role.setdefault(r["role"], []).append(r)
    slow = {}
    for peers in by_role.values():
        if len(peers) < 2:
            continue
        median = statistics.median(float(r["samples_per_s"] or 0.0) for r in peers)
        slow.update({r["id"]: median for r in peers
                     if float(r["samples_per_s"] or 0.0) < SLOW_SHARE * median})
    return slow


def recoveries(total: int, by_kind: Mapping[str, int] | None) -> str:
    """``3 (shard 2, rollback 1)``: every recovery and, where control says, of what kind."""
    kinds = ", ".join(f"{kind.replace('_', ' ')} {n}" for kind, n in (by_kind or {}).items()
                      if n)
    return f"{total} ({kinds})" if kinds else str(total)


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


# A part of a line that ``fit`` may shorten: its forms, longest first, each with how much it
# matters to keep that form rather than the next (the form of least worth goes first); a part
# whose last form has worth KEEP is never left out, only cut at the line's end.
Part = Sequence[tuple[float, Text | str]]
KEEP = float("inf")


def fit(parts: Sequence[Part], width: int | None) -> Text:
    """``parts`` in one line of at most ``width`` cells (None: no limit): while it is too
    long, the part whose form is worth least takes its next form or, having none, is left out
    (of two worth the same, the later); what still does not fit is cut with …."""
    chosen = [0] * len(parts)

    def line() -> Text:
        text = Text()
        for part, at in zip(parts, chosen, strict=True):
            if at < len(part):
                text.append(part[at][1])
        return text

    text = line()
    while width is not None and text.cell_len > width:
        left = [(part[at][0], -i) for i, (part, at) in enumerate(zip(parts, chosen, strict=True))
                if at < len(part) and part[at][0] != KEEP]
        if not left:
            text.truncate(width, overflow="ellipsis")
            break
        chosen[-min(left)[1]] += 1
        text = line()
    return text


# how a job that did not fail ended: completed, stopped by an operator, or interrupted by a
# signal (resumable); any other end is a failure, in red
END_STYLE = {"completed": "bold green", "stopped": "bold green",
             "interrupted": "bold yellow"}


def final_parts(f: Final) -> list[Part]:
    """How the job ended, in parts: the status (``END_STYLE``), its figures (AUC kept
    longest), why (a job that did not complete), and where its summary is."""
    parts: list[Part] = [[(KEEP, Text(str(f.get("status")),
                                      style=END_STYLE.get(str(f.get("status")), "bold red")))]]
    auc = f"auc {f['auc']:.4f}" if f.get("auc") is not None else None
    logloss = f"logloss {f['logloss']:.4f}" if f.get("logloss") is not None else None
    wall = f"in {duration(f['wall_s'])}" if f.get("wall_s") is not None else None
    figures = [[auc, logloss, wall], [auc, wall], [auc]]
    parts.append([(worth, ": " + ", ".join(shown))
                  for worth, kept in zip((4, 6, 7), figures, strict=True)
                  if (shown := [x for x in kept if x])])
    if f.get("reason") and f.get("status") != "completed":
        parts.append([(KEEP, f" ({f['reason']})")])
    summary = str(f.get("summary"))
    parts.append([(5, f"; summary {summary}")]
                 + ([(6, "; summary.json")] if summary.endswith("/summary.json") else []))
    return parts


def final_line(f: Final) -> Text:
    """How the job ended: ``completed: auc 0.9071, logloss 0.3012 in 45s; summary runs/...``."""
    return fit(final_parts(f), None)


def top_line(s: StatusSnapshot | None, connected: bool, detail: str,
             width: int | None) -> tuple[str, Text]:
    """The line above the tabs and its class (``up``, ``ended``, ``down``), in ``width``
    cells: the job's phase and progress; how it ended once it has (also after control has
    exited); or that control is not heard. Narrow, the least useful figures go first (the
    sync mode, the round, the job's name where the run's id begins with it)."""
    if s is None or not (final := s.get("final")):
        if not connected:
            return "down", fit([[(KEEP, f"✗ {detail}")]], width)
        if s is None:
            return "up", fit([[(KEEP, f"● {detail}")]], width)
    job, run = s["job"], s["run_id"]
    name: Part = [] if run.startswith(job) else [(1, f"{job} ")]
    if final:
        ended = [[(KEEP, "■ ")], name, [(KEEP, f"{run}  ")], *final_parts(final)]
        if not connected:
            ended.append([(8, " (control has exited)")])
        failed = str(final.get("status")) not in END_STYLE
        return ("down" if failed else "ended"), fit(ended, width)
    epoch = f"epoch {s['epoch'] + 1}/{s['epochs']}" if s["epoch"] >= 0 else "epoch -"
    t = s["training"]
    share = ""
    stream = s.get("stream")
    if stream is not None:   # no epochs: the events trained so far
        epoch = f"stream {count(stream['events_trained'])} events"
    elif s["epoch"] >= 0 and t.get("samples_per_epoch"):
        share = f" {min(1.0, t['epoch_samples'] / t['samples_per_epoch']):.0%}"
    waiting = [w["node"] for w in s.get("waiting") or []] if s["phase"] != "starting" else []
    parts: list[Part] = [
        [(KEEP, "● ")], name, [(KEEP, run)], [(KEEP, f"  {s['phase']}")],
        [(7, f", waiting for {', '.join(waiting)}"), (8, ", waiting")] if waiting else [],
        [(9, "  PAUSED")] if s["paused"] else [],
        [(5, f"  {epoch}{share}"), (6, f"  {epoch}")],
        [(4, f"  round {s['round']}")],
        [(3, f"  sync {s['sync']}")]]
    return "up", fit(parts, width)


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
