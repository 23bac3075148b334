"""A feeder's share of the data: the parts control's PartMap gives it, and where a part taken
over from a lost feeder resumes (pure; no sockets)."""

from __future__ import annotations

from roles.algorithms.feeding.ledger import PartProgress
from roles.data.index import FileIndex, Part, exact_rows
from roles.protocol.datapath import DataIndex, PartMap
from zbus.codec import ProtocolError


def assign_parts(rows: list[int], feeders: int) -> list[int]:
    """The feeder of each part: consecutive parts to each feeder, about as many rows each (a
    feeder gets none only when there are fewer parts than feeders)."""
    total = sum(rows)
    owners, before = [], 0
    for n in rows:
        owners.append(min(feeders - 1, before * feeders // total) if total else 0)
        before += n
    if len(rows) >= feeders:  # every feeder reads something
        for f in range(feeders):
            if f not in owners:
                owners[max(range(len(owners)),
                           key=lambda i: (owners.count(owners[i]), -abs(owners[i] - f)))] = f
        owners = sorted(owners)
    return owners


def estimated_files(m: PartMap | DataIndex) -> set[int]:
    """The files of the map (or of the index) whose rows are estimates (plain text not
    counted: ``n_train``, the parts' rows; exact from a part's first pass on); none when its
    body does not read as files (the feeders refuse such a body when they adopt its files)."""
    try:
        return {i for i, f in enumerate(m.files())
                if not exact_rows(FileIndex(**{"marks": [], **f}))}
    except (ProtocolError, TypeError, ValueError):
        return set()


class FeederParts:
    def __init__(self, index: int):
        self.index = index
        self.map: PartMap | None = None
        self.parts: list[Part] = []
        self.estimated: set[int] = set()   # files whose parts' rows are estimates

    @property
    def current(self) -> PartMap:
        assert self.map is not None, "no PartMap yet"
        return self.map

    def take(self, m: PartMap) -> list[int]:
        """Control's new map; the parts it newly gives this feeder (none with the first)."""
        before = None if self.map is None else set(self.mine())
        self.map = m
        self.parts = [Part.of(row) for row in m.parts.tolist()]
        self.estimated = estimated_files(m)
        return [] if before is None else [i for i in self.mine() if i not in before]

    def mine(self, eval: bool | None = None) -> list[int]:
        """This feeder's parts (only its training or eval ones when ``eval`` says which)."""
        owners = self.current.owners
        return [p.number for p in self.parts if int(owners[p.number]) == self.index
                and (eval is None or p.eval == eval)]

    def describe(self, parts: list[int]) -> str:
        """The parts for a person, a run of consecutive parts of one kind and file in one
        phrase: ``0-62 (training rows 0..35166 of file 0), 63 (eval rows ...)``; the parts of a
        file whose rows are estimates by their bytes: ``0-1 (training bytes 0..4096 of file
        0)``."""
        runs: list[list[Part]] = []
        for p in (self.parts[n] for n in parts):
            last = runs[-1][-1] if runs else None
            if last is not None and (last.number + 1, last.eval, last.file) == (
                    p.number, p.eval, p.file):
                runs[-1].append(p)
            else:
                runs.append([p])

        def one(run: list[Part]) -> str:
            first, last = run[0], run[-1]
            numbers = f"{first.number}-{last.number}" if len(run) > 1 else f"{first.number}"
            kind = "eval" if first.eval else "training"
            if first.file in self.estimated:
                return f"{numbers} ({kind} bytes {first.start}..{last.end} of file {first.file})"
            return f"{numbers} ({kind} rows {first.first_row}..{last.first_row + last.rows} " \
                   f"of file {first.file})"
        return ", ".join(one(run) for run in runs) or "none"

    def resumed(self, part: int, epoch: int) -> PartProgress | None:
        """Where a lost feeder's part stands in the training pass of ``epoch`` (None: the part
        starts afresh, or that feeder had reported the pass)."""
        r = self.current.resume.get(str(part))
        if not isinstance(r, dict) or r.get("epoch") != epoch or r.get("reported") is True:
            return None
        return PartProgress.of(r)

    def handed_over(self, part: int) -> bool:
        """A lost feeder's part of the training pass under way that it had not reported."""
        r = self.current.resume.get(str(part))
        return isinstance(r, dict) and r.get("reported") is not True

    def scoring(self, part: int) -> bool:
        """A lost feeder's eval part that it was scoring (its training parts come with the
        same phase, and are not scored)."""
        r = self.current.resume.get(str(part), {})
        return bool(self.parts[part].eval and isinstance(r, dict)
                    and r.get("phase") == "evaluating")
