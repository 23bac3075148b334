"""The dense network's computation as a task graph (no sockets): sub-tasks with a cost, flow
relations (edges) carrying tensor bytes, and which of them are critical.

An edge is critical when its bytes exceed ``critical_bytes`` or it lies on the longest path
(the chain of sub-tasks whose costs add up most, ``critical_path``). Cutting a critical edge
between devices costs most: a large transfer, or one that the whole step waits for. An edge
may also be *uncut*: it must never be cut (a traced network's value that is not a float tensor
cannot cross between devices); the partitioner keeps the sub-tasks it joins on one part.

``from_model`` traces a module with torch.fx and estimates each node's cost in FLOPs from the
shapes of one example batch; ``layered_dag`` makes random graphs for tests and benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class TaskGraph:
    """Nodes 0..n-1 in topological order; edge e goes src[e] -> dst[e]."""

    names: list[str]
    cost: np.ndarray                      # float64 [n]
    src: np.ndarray                       # int64 [m]
    dst: np.ndarray                       # int64 [m]
    nbytes: np.ndarray                    # float64 [m]
    critical: np.ndarray                  # bool [m]
    pinned: dict[int, int] = field(default_factory=dict)  # node -> part it must stay on
    uncut: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # bool [m]

    def __post_init__(self) -> None:
        if len(self.uncut) == 0:   # none given: every edge may be cut
            self.uncut = np.zeros(len(self.src), dtype=bool)
        if len(self.uncut) != len(self.src):
            raise ValueError("uncut needs one flag per edge")

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def m(self) -> int:
        return len(self.src)

    @classmethod
    def build(cls, names: list[str], cost: list[float] | np.ndarray,
              edges: list[tuple[int, int]], nbytes: list[float] | np.ndarray | None = None,
              critical: list[bool] | np.ndarray | None = None,
              pinned: dict[int, int] | None = None,
              uncut: list[bool] | np.ndarray | None = None) -> TaskGraph:
        arr = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        n = len(names)
        if arr.size and (arr.min() < 0 or arr.max() >= n):
            raise ValueError("an edge names a sub-task that does not exist")
        if np.any(arr[:, 0] >= arr[:, 1]):
            raise ValueError("nodes must be numbered in topological order (src < dst)")
        m = len(arr)
        return cls(list(names), np.asarray(cost, dtype=np.float64), arr[:, 0].copy(),
                   arr[:, 1].copy(),
                   np.zeros(m) if nbytes is None else np.asarray(nbytes, dtype=np.float64),
                   np.zeros(m, dtype=bool) if critical is None
                   else np.asarray(critical, dtype=bool), dict(pinned or {}),
                   np.zeros(m, dtype=bool) if uncut is None else np.asarray(uncut, dtype=bool))

    def longest_path_edges(self) -> np.ndarray:
        """Bool [m]: the edges of the heaviest path (sum of node costs), start to end."""
        n = self.n
        best = self.cost.copy()
        via = np.full(n, -1, dtype=np.int64)        # the edge into v on its heaviest path
        order = np.argsort(self.dst, kind="stable")  # edges by target; targets ascend
        for e in order:                              # = topological order of targets
            u, v = self.src[e], self.dst[e]
            if best[u] + self.cost[v] > best[v]:
                best[v] = best[u] + self.cost[v]
                via[v] = e
        on = np.zeros(self.m, dtype=bool)
        v = int(np.argmax(best)) if n else -1
        while v >= 0 and via[v] >= 0:
            on[via[v]] = True
            v = int(self.src[via[v]])
        return on

    def mark_critical(self, critical_bytes: float, critical_path: bool) -> None:
        self.critical = self.nbytes > critical_bytes
        if critical_path:
            self.critical |= self.longest_path_edges()


def layered_dag(nodes: int, seed: int = 0, width: int | None = None, fanout: int = 3,
                skip: float = 0.1, critical_quantile: float = 0.7) -> TaskGraph:
    """A random layered DAG like an unrolled network: layers of ``width`` nodes, each node
    feeding 1..fanout nodes near its position in the next layer, and a fraction ``skip`` of
    nodes also feeding one two layers on. Costs and bytes are log-normal; the edges above the
    ``critical_quantile`` of bytes, and the longest path, are critical."""
    rng = np.random.default_rng(seed)
    width = width or max(2, int(round(np.sqrt(nodes))))
    layer = np.arange(nodes) // width
    edges = []
    for v in range(nodes):
        for step, count in ((1, int(rng.integers(1, fanout + 1))),
                            (2, int(rng.random() < skip))):
            lo = (layer[v] + step) * width
            hi = min(lo + width, nodes)
            if lo >= nodes or count == 0:
                continue
            centre = lo + (v - layer[v] * width) * (hi - lo) // width
            spread = max(1, (hi - lo) // 8)
            targets = np.clip(centre + rng.integers(-spread, spread + 1, size=count), lo, hi - 1)
            edges += [(v, int(t)) for t in set(targets.tolist())]
    cost = rng.lognormal(0.0, 0.5, size=nodes)
    nbytes = rng.lognormal(10.0, 1.0, size=len(edges))
    g = TaskGraph.build([f"t{i}" for i in range(nodes)], cost, edges, nbytes)
    g.mark_critical(float(np.quantile(nbytes, critical_quantile)), True)
    return g
