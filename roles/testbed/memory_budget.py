"""A memory budget the kernel enforces on one process as a container's limit does: a cgroup of
its own under the memory controller (``LocalCluster.budgets``), which counts the pages the
process has in memory (its anonymous pages and the page cache it brings in), not the address
space it reserves. Beyond the limit the kernel first reclaims the page cache charged to the
cgroup, then kills the process (the OOM killer, as a pod's container is killed).

The cgroup is made beside or below this process's own (``/proc/self/cgroup``), so that what
limits this process's parent limits it too: in cgroup v1 (``memory.limit_in_bytes``,
``memory.stat``, ``memory.oom_control``) a child of it; in v2 (``memory.max``, ``memory.stat``,
``memory.events``), where a cgroup with processes in it gives its children no controller, a
sibling where this process's cgroup has the memory controller (its parent delegates it), else
a child. No swap to spill into either way. The process joins it before it runs (``join``, in
the child between fork and exec), so everything it allocates is charged. Making one needs the
controller mounted and writable (root, or a delegated subtree): ``unavailable`` says why not.
(``memory.failcnt`` is not read: a 6.18 kernel left it at 0 through reclaims and an OOM kill.)
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

_made = itertools.count()   # a name for each cgroup this process makes


class BudgetError(RuntimeError):
    """No memory cgroup can be made here (the message says why)."""


def _mount() -> tuple[Path, int]:
    """The memory controller's hierarchy as this process sees it: this process's cgroup there
    (a directory) and the cgroup version."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = {c: p for _, cs, p in (line.split(":", 2) for line in lines) for c in cs.split(",")}
    for entry in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, fs = entry.partition(" - ")
        _, _, _, root, point, *_ = fields.split()
        fstype, _, options = fs.split()[:3]
        if fstype == "cgroup" and "memory" in options.split(",") and "memory" in v1:
            return Path(point) / os.path.relpath(v1["memory"], root), 1
        if fstype == "cgroup2" and "" in v1 and "memory" in _read(Path(point) /
                                                                   "cgroup.controllers"):
            return Path(point) / os.path.relpath(v1[""], root), 2
    raise BudgetError("no cgroup memory controller is mounted")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class MemoryCgroup:
    """A cgroup of ``limit`` bytes of memory for one process, named after ``name`` (and this
    process's id, and a count); ``remove`` when its process has ended."""

    def __init__(self, name: str, limit: int):
        parent, self.version = _mount()
        if self.version == 2 and (parent / "memory.max").exists():
            parent = parent.parent   # v2 gives no controller to the children of a cgroup with
            #                          processes in it: a sibling, in a parent that delegates
        self.limit = limit
        self.path = parent / f"zbus-{os.getpid()}-{next(_made)}-{name}"
        if self.version == 2 and "memory" not in _read(parent / "cgroup.subtree_control"):
            try:
                (parent / "cgroup.subtree_control").write_text("+memory")
            except OSError as exc:   # EBUSY: processes in it (but at the root)
                raise BudgetError(f"cgroup v2: the children of {parent} cannot get the "
                                  f"memory controller ({exc.strerror})") from None
        try:
            self.path.mkdir()
        except OSError as exc:
            raise BudgetError(f"cannot make a memory cgroup under {parent}: {exc}") from None
        try:
            if self.version == 1:
                self._write("memory.limit_in_bytes", limit)
                if (self.path / "memory.memsw.limit_in_bytes").exists():
                    self._write("memory.memsw.limit_in_bytes", limit)   # no swap beyond it
            else:
                self._write("memory.max", limit)
                if (self.path / "memory.swap.max").exists():
                    self._write("memory.swap.max", 0)
        except OSError as exc:
            self.remove()
            raise BudgetError(f"cannot set the limit of {self.path}: {exc}") from None

    def _write(self, name: str, value: int) -> None:
        (self.path / name).write_text(str(value))

    def _pairs(self, name: str) -> dict[str, int]:
        return {k: int(v) for k, v in (line.split() for line in
                                       (self.path / name).read_text().splitlines())}

    def join(self) -> None:
        """Put the calling process in the cgroup (in a child before it runs its program)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def usage(self) -> dict[str, int]:
        """Charged now: ``anon`` (the process's own pages) and ``file`` (page cache)."""
        stat = self._pairs("memory.stat")
        if self.version == 1:
            return {"anon": stat["rss"], "file": stat["cache"]}
        return {"anon": stat["anon"], "file": stat["file"]}

    def kills(self) -> int:
        """Processes the kernel killed for the limit."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        return self._pairs(name).get("oom_kill", 0)

    def remove(self, wait_s: float = 5.0) -> None:
        """Remove the cgroup (its processes ended: a process just reaped may take a moment
        to leave it)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def unavailable() -> str | None:
    """Why no memory budget can be enforced here (None: one can): a cgroup made and removed."""
    try:
        MemoryCgroup("probe", 1 << 30).remove()
    except (BudgetError, OSError) as exc:
        return f"no memory budget can be enforced here: {exc}"
    return None
