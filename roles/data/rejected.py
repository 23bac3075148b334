"""The rows set aside: ``rejected.tsv`` in the run directory, one line per rejected row (file,
line — row number for Parquet —, reason, the row as read). A feeder appends the rejected rows
of a part the first time it reads the part whole (epoch 0, or its first evaluation), each
block's in one write on a file opened for appending; which parts it has written is kept beside
its ack log, so that a feeder started again does not write a part's rows twice."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from roles.data.readers import RawBlock, Rejected

HEADER = "file\tline\treason\trow\n"


def _clean(text: str) -> str:
    return text.replace("\t", "\\t").replace("\n", "\\n")


def lines_of(rejected: list[Rejected]) -> str:
    return "".join(f"{_clean(r.file)}\t{r.line}\t{_clean(r.reason)}\t{_clean(r.text)}\n"
                   for r in rejected)


class RejectedRows:
    def __init__(self, path: Path, written: Path):
        self.path, self.written_path = path, written
        written.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.written = {int(x) for x in written.read_text().split()}
        except FileNotFoundError:
            self.written = set()
        self.count = 0

    def append(self, rejected: list[Rejected]) -> None:
        if not rejected:
            return
        new = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, ((HEADER if new else "") + lines_of(rejected)).encode())
        finally:
            os.close(fd)
        self.count += len(rejected)

    def _appended(self, block: RawBlock) -> RawBlock:
        self.append(block.rejected)
        return block

    def watch(self, part: int, blocks: Iterator[RawBlock]) -> Iterator[RawBlock]:
        """The part's blocks, their rejected rows written on the way (the first time the part
        is read to its end)."""
        if part in self.written:
            yield from blocks
            return
        yield from map(self._appended, blocks)   # (map: no frame holds a block in use)
        self.written.add(part)
        with open(self.written_path, "a") as f:
            f.write(f"{part}\n")
