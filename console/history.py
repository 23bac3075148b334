"""Each node's recent figures as the console saw them (pure): CPU, resident memory and bus
bytes in and out per second, one point per ``every_s`` of control's clock (the status's
``uptime_s``), the last ``keep_s``. The console keeps it from the statuses it receives, so a
console started late shows what it has seen since."""

from __future__ import annotations

from collections import deque

from console.format import figure
from roles.protocol.status import StatusSnapshot

FIGURES = ("cpu", "rss", "in_per_s", "out_per_s")


class NodeHistory:
    def __init__(self, keep_s: float = 300.0, every_s: float = 1.0):
        self.every_s = every_s
        self.points = int(keep_s / every_s)
        self.nodes: dict[str, deque[tuple[float, dict[str, float | None]]]] = {}

    def add(self, snapshot: StatusSnapshot) -> bool:
        """The figures of a status; False when it added no point (too soon after the last)."""
        t = float(snapshot.get("uptime_s") or 0.0)
        added = False
        for row in snapshot.get("nodes", []):
            points = self.nodes.setdefault(row["id"], deque(maxlen=self.points))
            if points and 0 <= t - points[-1][0] < self.every_s - 1e-6:
                continue
            if points and t < points[-1][0]:   # control started again: its clock too
                points.clear()
            points.append((t, {k: figure(row, k) for k in FIGURES}))
            added = True
        return added

    def of(self, node_id: str, figure: str) -> tuple[list[float], list[float | None]]:
        """A node's figure over time: (times, values)."""
        points = self.nodes.get(node_id, ())
        return [t for t, _ in points], [f.get(figure) for _, f in points]
