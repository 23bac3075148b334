"""Partition a task graph into k parts with the fewest cut critical edges under a balance bound
(pure code: numpy, no sockets, no torch).

1. **Sets.** Sub-tasks are clustered along their flow relations: each round matches every
   sub-task with the unmatched neighbour it shares most critical relations with (any relation
   when it has no critical one), as long as the set stays light; rounds repeat until at most
   ``coarse_target`` sets are left (``coarsen_to``, by default max(16, 2k)), or until a round
   merges less than 5% (then the coarsest level has more: 33 sets on 10k-node layered DAGs).
   Every round is a level, coarsest last.
2. **Initial partition.** The sets are assigned to the k parts at random (a set goes to a random
   part that still has room), then a random set is moved to a random other part, again and
   again (``initial_moves``); the assignment with the fewest cut edges seen within the balance
   bound is kept (cut critical edges first, then all cut edges).
3. **Refinement**, on every level from the coarsest to the sub-tasks themselves. Boundary
   sub-tasks are those with a flow relation to another part. For each, the *first gain* is its
   critical relations inside its own part and the *second gain* its critical relations to each
   other part. A boundary sub-task whose second gain minus first gain exceeds ``threshold``
   moves toward that part, if the part stays within the balance bound; the target is the best
   such part (``target = "every"``) or the first in flow order among the parts of its
   neighbours (``"flow"``). Gains are recomputed after every move. An iteration visits the
   boundary, in the order ``pick`` says: the sub-task with the largest gain first (``"gain"``,
   the default) or in flow order, upstream first (``"flow"``, the method's choice of which
   boundary sub-task moves: measured in ``scripts/bench_partition.py``). The default
   ``threshold`` of -0.5 also moves a sub-task that loses no critical relation (a plateau
   move, which lets the boundary travel); relations that are not critical only break ties
   between such moves. The refinement stops when an iteration brings no
   boundary sub-task not seen before (or after ``max_iterations``) and returns the partition
   with the fewest cut critical edges seen over all its iterations.
   Before refining a level, parts over the bound give away the sub-tasks that lose fewest
   critical relations (``rebalance``).

The initial partition keeps the fewest cut critical edges of ``tries`` random starts, each
refined on the coarsest level.

Uncut edges (``TaskGraph.uncut``: a traced network's values that are not float tensors) are
honoured before step 1: the sub-tasks they join, transitively, are contracted into one *unit*
(``units``), a unit holding a pinned sub-task is pinned, and every step above works on the
units, so no partition can cut such an edge (a weight would only make cutting it unlikely).
The last refinement is then on the units rather than the sub-tasks.

Load is a sub-task's cost; the balance bound is max part load <= ``balance`` x total / k. When
one sub-task is heavier than that, no partition meets the bound: the parts may then hold up to
that sub-task's load, and ``Partition.balanced`` says the bound was not met.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from roles.model.task_graph import TaskGraph

TARGETS = ("every", "flow")
PICKS = ("gain", "flow")


@dataclass(frozen=True)
class PartitionSettings:
    parts: int
    balance: float = 1.2
    threshold: float = -0.5      # < 0: moves that lose no critical relation go too
    target: str = "every"
    pick: str = "gain"           # which boundary sub-task moves first: largest gain, or flow
    seed: int = 0
    initial_moves: int = 0       # 0: 40 per set
    max_iterations: int = 64
    tries: int = 8               # initial partitions of the coarsest sets
    coarsen_to: int = 0          # 0: max(16, 2k) sets (coarse_target)

    def __post_init__(self) -> None:
        if self.parts < 1:
            raise ValueError("parts must be >= 1")
        if self.balance < 1.0:
            raise ValueError("balance must be >= 1.0")
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}")
        if self.pick not in PICKS:
            raise ValueError(f"pick must be one of {', '.join(PICKS)}")


@dataclass
class Partition:
    assign: np.ndarray            # part of every sub-task
    cut_critical: int
    cut_edges: int
    loads: np.ndarray             # per part
    balance: float                # max load / mean load
    balanced: bool                # within the bound
    history: list[int] = field(default_factory=list)  # cut critical per refinement iteration
    levels: int = 0
    seconds: float = 0.0
    coarsest_sets: int = 0        # sets on the coarsest level (the initial partition's)


class Level:
    """A graph the algorithm works on: the sub-tasks, or the sets of a coarser level."""

    def __init__(self, n: int, load: np.ndarray, a: np.ndarray, b: np.ndarray,
                 crit: np.ndarray, count: np.ndarray, pin: np.ndarray, flow: np.ndarray):
        self.n, self.load, self.pin, self.flow = n, load, pin, flow
        self.a, self.b, self.crit, self.count = a, b, crit, count   # one row per relation
        # what a move weighs: critical relations, then other relations as a tie-break only
        # (all of a sub-task's relations together weigh less than one critical relation)
        degree = np.bincount(np.concatenate([a, b]), weights=np.concatenate([count, count]),
                             minlength=n) if len(a) else np.zeros(n)
        tie = 1.0 / (2.0 + float(degree.max(initial=0.0)))
        self.weight = crit + tie * (count - crit).clip(min=0.0)
        self.adj: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        for u, v, c in zip(a.tolist(), b.tolist(), self.weight.tolist(), strict=True):
            self.adj[u].append((v, c))
            self.adj[v].append((u, c))

    @classmethod
    def of(cls, g: TaskGraph) -> Level:
        pin = np.full(g.n, -1, dtype=np.int64)
        for node, part in g.pinned.items():
            pin[node] = part
        return cls(g.n, g.cost.astype(np.float64), g.src, g.dst,
                   g.critical.astype(np.float64), np.ones(g.m), pin,
                   np.arange(g.n, dtype=np.int64))

    def merged(self, of: np.ndarray) -> Level:
        """The level whose nodes are the sets ``of`` gives each node (numbered 0..m-1): loads
        and relations summed, relations inside a set dropped, a set pinned where a node of it
        is, its flow position its first node's."""
        m = int(of.max()) + 1 if len(of) else 0
        load = np.bincount(of, weights=self.load, minlength=m)
        pin = np.full(m, -1, dtype=np.int64)
        np.maximum.at(pin, of, self.pin)
        flow = np.full(m, self.n, dtype=np.int64)
        np.minimum.at(flow, of, self.flow)
        ca, cb = of[self.a], of[self.b]
        keep = ca != cb
        lo, hi = np.minimum(ca, cb)[keep], np.maximum(ca, cb)[keep]
        pair, inv = np.unique(lo * m + hi, return_inverse=True)
        crit = np.bincount(inv, weights=self.crit[keep], minlength=len(pair))
        count = np.bincount(inv, weights=self.count[keep], minlength=len(pair))
        return Level(m, load, pair // m, pair % m, crit, count, pin, flow)

    def cut(self, assign: np.ndarray) -> tuple[int, int]:
        across = assign[self.a] != assign[self.b]
        return int(round(self.crit[across].sum())), int(round(self.count[across].sum()))

    def gain_matrix(self, assign: np.ndarray, k: int, critical_only: bool = False) -> np.ndarray:
        """[n, k]: the relations of each sub-task to each part (first gain: its own part),
        critical ones plus the tie-break weight of the others unless ``critical_only``."""
        w = self.crit if critical_only else self.weight
        g = np.zeros((self.n, k))
        np.add.at(g, (self.a, assign[self.b]), w)
        np.add.at(g, (self.b, assign[self.a]), w)
        return g

    def weighted_cut(self, assign: np.ndarray) -> float:
        return float(self.weight[assign[self.a] != assign[self.b]].sum())

    def boundary(self, assign: np.ndarray) -> np.ndarray:
        across = assign[self.a] != assign[self.b]
        return np.unique(np.concatenate([self.a[across], self.b[across]]))


def gains(g: TaskGraph, assign: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(first gain [n], second gain [n, k]) of every sub-task; the second gain toward its own
    part is the first gain."""
    second = Level.of(g).gain_matrix(np.asarray(assign), k, critical_only=True)
    return second[np.arange(g.n), assign], second


def loads_of(level: Level, assign: np.ndarray, k: int) -> np.ndarray:
    return np.bincount(assign, weights=level.load, minlength=k)


class Mover:
    """An assignment with its gain matrix and loads kept current move by move."""

    def __init__(self, level: Level, assign: np.ndarray, k: int):
        self.level, self.k = level, k
        self.assign = assign.copy()
        self.gain = level.gain_matrix(self.assign, k)
        self.loads = loads_of(level, self.assign, k)

    def move(self, i: int, to: int) -> None:
        frm = int(self.assign[i])
        for v, c in self.level.adj[i]:
            if c:
                self.gain[v, frm] -= c
                self.gain[v, to] += c
        w = self.level.load[i]
        self.loads[frm] -= w
        self.loads[to] += w
        self.assign[i] = to

    def candidates(self, i: int, target: str) -> list[int]:
        own = int(self.assign[i])
        if target == "every":
            order = np.lexsort((self.loads, -self.gain[i]))
            return [int(p) for p in order if p != own]
        seen: list[int] = []   # flow order: the parts of its neighbours, upstream first
        for v, _ in sorted(self.level.adj[i], key=lambda vc: self.level.flow[vc[0]]):
            p = int(self.assign[v])
            if p != own and p not in seen:
                seen.append(p)
        return seen


def _better(cut: tuple[float, ...], over: float, best: tuple[float, ...],
            best_over: float) -> bool:
    """Within the bound beats over it; then fewer cut critical edges, then fewer cut edges;
    over the bound, less over it wins."""
    if (over <= 0) != (best_over <= 0):
        return over <= 0
    if over > 0:
        return over < best_over or (over == best_over and cut < best)
    return cut < best


def visiting_order(level: Level, mv: Mover, border: np.ndarray, pick: str) -> np.ndarray:
    """The boundary sub-tasks in the order an iteration visits them: largest gain (best second
    gain minus first gain) first, or in flow order (upstream first)."""
    if pick == "flow":
        return border[np.argsort(level.flow[border], kind="stable")]
    own = mv.gain[border, mv.assign[border]]
    return border[np.argsort(-(mv.gain[border].max(axis=1) - own), kind="stable")]


def refine_level(level: Level, assign: np.ndarray, k: int, cap: float, threshold: float,
                 target: str, max_iterations: int,
                 pick: str = "gain") -> tuple[np.ndarray, list[int]]:
    """The refinement of the module docstring on one level: (best assignment, cut critical
    edges after every iteration, the starting one first)."""
    mv = Mover(level, assign, k)
    best = mv.assign.copy()
    best_cut, best_over = level.cut(best), max(0.0, mv.loads.max() - cap)
    history = [best_cut[0]]
    seen: set[int] = set()
    for _ in range(max_iterations):
        border = level.boundary(mv.assign)
        new = set(border.tolist()) - seen
        if not new:
            break   # the stop rule: no boundary sub-task not seen before
        seen |= new
        for i in visiting_order(level, mv, border, pick).tolist():
            if level.pin[i] >= 0:
                continue
            a = int(mv.assign[i])
            for p in mv.candidates(i, target):
                if mv.gain[i, p] - mv.gain[i, a] > threshold and \
                        mv.loads[p] + level.load[i] <= cap:
                    mv.move(i, p)
                    break
        cut, over = level.cut(mv.assign), max(0.0, mv.loads.max() - cap)
        history.append(cut[0])
        if _better(cut, over, best_cut, best_over):
            best, best_cut, best_over = mv.assign.copy(), cut, over
    return best, history


def rebalance(mv: Mover, cap: float) -> None:
    """While a part is over the bound, move the sub-task of it that loses fewest critical
    relations to a part with room."""
    level = mv.level
    for _ in range(level.n):
        heavy = int(np.argmax(mv.loads))
        if mv.loads[heavy] <= cap:
            return
        members = np.flatnonzero((mv.assign == heavy) & (level.pin < 0))
        room = cap - mv.loads
        fits = level.load[members][:, None] <= room[None, :]
        fits[:, heavy] = False
        if not fits.any():
            return
        diff = np.where(fits, mv.gain[members] - mv.gain[members, heavy][:, None], -np.inf)
        row, part = np.unravel_index(np.argmax(diff), diff.shape)
        mv.move(int(members[row]), int(part))


def coarsen(level: Level, cap: float, rng: np.random.Generator) -> tuple[Level, np.ndarray]:
    """One round of clustering: (the level of sets, the set of every node)."""
    mate = np.full(level.n, -1, dtype=np.int64)
    # relation weight: critical ones first, any flow relation after
    prefer: dict[tuple[int, int], float] = {}
    for u, v, c, n in zip(level.a.tolist(), level.b.tolist(), level.crit.tolist(),
                          level.count.tolist(), strict=True):
        w = c + 1e-3 * n
        prefer[(u, v)] = prefer.get((u, v), 0.0) + w
        prefer[(v, u)] = prefer.get((v, u), 0.0) + w
    for u in rng.permutation(level.n).tolist():
        if mate[u] >= 0:
            continue
        best, best_w = -1, 0.0
        for v, _ in level.adj[u]:
            if mate[v] >= 0 or v == u or level.load[u] + level.load[v] > cap:
                continue
            if level.pin[u] >= 0 and level.pin[v] >= 0 and level.pin[u] != level.pin[v]:
                continue
            w = prefer[(u, v)]
            if w > best_w:
                best, best_w = v, w
        mate[u] = best if best >= 0 else u
        if best >= 0:
            mate[best] = u
    keys = np.minimum(np.arange(level.n), mate)
    _, of = np.unique(keys, return_inverse=True)
    return level.merged(of), of


def units(g: TaskGraph) -> np.ndarray:
    """The unit of every sub-task: sub-tasks joined by uncut edges, transitively, make one
    unit; units are numbered in the order of their first sub-task. A unit cannot hold
    sub-tasks pinned to different parts (a ValueError)."""
    parent = np.arange(g.n)

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = int(parent[x])
        return x

    for e in np.flatnonzero(g.uncut).tolist():
        a, b = root(int(g.src[e])), root(int(g.dst[e]))
        if a != b:
            parent[max(a, b)] = min(a, b)
    _, of = np.unique([root(i) for i in range(g.n)], return_inverse=True)
    pins: dict[int, set[int]] = {}
    for node, part in g.pinned.items():
        pins.setdefault(int(of[node]), set()).add(part)
    clash = [u for u, parts in pins.items() if len(parts) > 1]
    if clash:
        names = [g.names[i] for i in np.flatnonzero(of == clash[0])[:5]]
        raise ValueError(f"sub-tasks pinned to different parts are joined by uncut edges "
                         f"({', '.join(names)})")
    return of.astype(np.int64)


def initial_partition(level: Level, k: int, cap: float, moves: int,
                      rng: np.random.Generator) -> np.ndarray:
    """Sets to parts at random, then random moves; the best assignment seen."""
    assign = np.zeros(level.n, dtype=np.int64)
    loads = np.zeros(k)
    for i in rng.permutation(level.n).tolist():
        if level.pin[i] >= 0:
            p = int(level.pin[i])
        else:
            room = np.flatnonzero(loads + level.load[i] <= cap)
            p = int(rng.choice(room)) if room.size else int(np.argmin(loads))
        assign[i] = p
        loads[p] += level.load[i]
    mv = Mover(level, assign, k)
    free = np.flatnonzero(level.pin < 0)
    score = level.weighted_cut(mv.assign)   # cut critical edges, other cut edges breaking ties
    best, best_score = mv.assign.copy(), (score,)
    best_over = max(0.0, mv.loads.max() - cap)
    if free.size == 0 or k < 2:
        return best
    for step in range(moves):
        i = int(rng.choice(free))
        a = int(mv.assign[i])
        p = int(rng.integers(k - 1))
        p += p >= a
        if mv.loads[p] + level.load[i] > cap and mv.loads[p] + level.load[i] > mv.loads[a]:
            continue   # neither within the bound nor toward it
        score += mv.gain[i, a] - mv.gain[i, p]
        mv.move(i, p)
        over = max(0.0, mv.loads.max() - cap)
        if _better((score,), over, best_score, best_over):
            best, best_score, best_over = mv.assign.copy(), (score,), over
        if step % max(1, level.n) == level.n - 1:   # go on from the best seen now and then
            mv, score = Mover(level, best, k), best_score[0]
    return best


def partition(g: TaskGraph, s: PartitionSettings) -> Partition:
    started = time.perf_counter()
    k = s.parts
    rng = np.random.default_rng(s.seed)
    finest = Level.of(g)
    unit_of = units(g) if g.uncut.any() else None
    base = finest if unit_of is None else finest.merged(unit_of)   # what may move alone
    total = float(base.load.sum())
    bound = s.balance * total / k
    cap = max(bound, float(base.load.max(initial=0.0)))  # no part can hold less than that
    if k == 1:
        assign = np.zeros(g.n, dtype=np.int64)
        return _result(finest, assign, k, bound, [finest.cut(assign)[0]], 0, started)
    target_sets = coarse_target(k, s.coarsen_to)
    levels, maps = [base], []
    while levels[-1].n > target_sets or len(levels) == 1:
        set_cap = max(1.5 * total / target_sets, 1e-12)
        coarse, of = coarsen(levels[-1], set_cap, rng)
        if coarse.n >= levels[-1].n * 0.95:
            break   # nothing left to cluster
        levels.append(coarse)
        maps.append(of)
    coarsest = levels[-1]
    # a few initial partitions of the sets, each refined; the best goes on
    tries: list[tuple[bool, float, float, int, np.ndarray]] = []
    for _ in range(max(1, s.tries)):
        start = initial_partition(coarsest, k, cap, s.initial_moves or 40 * coarsest.n, rng)
        mv = Mover(coarsest, start, k)
        rebalance(mv, cap)
        tried, _ = refine_level(coarsest, mv.assign, k, cap, s.threshold, s.target,
                                s.max_iterations, s.pick)
        over = max(0.0, loads_of(coarsest, tried, k).max() - cap)
        tries.append((over > 0, over, coarsest.weighted_cut(tried), len(tries), tried))
    assign = min(tries)[-1]
    history: list[int] = []
    for depth in range(len(levels) - 1, -1, -1):
        mv = Mover(levels[depth], assign, k)
        rebalance(mv, cap)
        assign, history = refine_level(levels[depth], mv.assign, k, cap, s.threshold, s.target,
                                       s.max_iterations, s.pick)
        if depth:
            assign = assign[maps[depth - 1]]
    if unit_of is not None:
        assign = assign[unit_of]   # every sub-task goes with its unit
    result = _result(finest, assign, k, bound, history, len(levels), started)
    result.coarsest_sets = coarsest.n
    return result


def coarse_target(k: int, coarsen_to: int = 0) -> int:
    """How many sets the coarsening aims at: ``coarsen_to``, by default max(16, 2k)."""
    return coarsen_to or max(16, 2 * k)


def refine(g: TaskGraph, assign: np.ndarray, s: PartitionSettings) -> Partition:
    """The refinement alone, on the sub-tasks, from a given partition (uncut edges are not
    looked at: ``partition`` honours them)."""
    started = time.perf_counter()
    level = Level.of(g)
    cap = s.balance * float(level.load.sum()) / s.parts
    best, history = refine_level(level, np.asarray(assign, dtype=np.int64), s.parts, cap,
                                 s.threshold, s.target, s.max_iterations, s.pick)
    return _result(level, best, s.parts, cap, history, 1, started)


def _result(level: Level, assign: np.ndarray, k: int, cap: float, history: list[int],
            levels: int, started: float) -> Partition:
    cut_critical, cut_edges = level.cut(assign)
    loads = loads_of(level, assign, k)
    mean = loads.sum() / k
    return Partition(assign, cut_critical, cut_edges, loads,
                     float(loads.max() / mean) if mean > 0 else 1.0,
                     bool(loads.max() <= cap + 1e-9), history, levels,
                     time.perf_counter() - started)


def balance_of(g: TaskGraph, assign: np.ndarray, k: int) -> float:
    loads = np.bincount(assign, weights=g.cost, minlength=k)
    return float(loads.max() / (loads.sum() / k))


def cut_counts(g: TaskGraph, assign: np.ndarray) -> tuple[int, int]:
    """(cut critical edges, cut edges)."""
    return Level.of(g).cut(np.asarray(assign))
