"""The one error a network that cannot be built or run raises, and the one-line wording of an
exception caught from a user's module (its type, its message's first line, and where it was
raised in that module's file when the traceback says)."""

from __future__ import annotations

import traceback
from pathlib import Path

LONGEST = 300   # characters of an exception's message kept in a one-line report


class NetworkError(ValueError):
    """A network that cannot be loaded, built or run on a sample batch: one line that names the
    module's file (or the built-in network) and what is wrong."""


def one_line(text: str) -> str:
    """``text`` on one line (its whitespace runs as single spaces), cut to ``LONGEST``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= LONGEST else flat[:LONGEST - 3] + "..."


def _resolved(path: str) -> Path | None:
    try:
        return Path(path).resolve()
    except (OSError, ValueError):
        return None


def _users(frames: list[traceback.FrameSummary], source_file: Path
           ) -> list[traceback.FrameSummary]:
    """The frames in the user's file; failing that (a package's other modules), the frames in
    its directory, but not in installed packages (torch) or in zbus's own ``roles``."""
    mine = source_file.resolve()
    exact = [f for f in frames if _resolved(f.filename) == mine]
    if exact:
        return exact
    ours = Path(__file__).resolve().parents[2]
    beside = []
    for f in frames:
        here = _resolved(f.filename)
        if here is not None and here.is_relative_to(mine.parent) \
                and not here.is_relative_to(ours) \
                and not {"site-packages", "dist-packages"} & set(here.parts):
            beside.append(f)
    return beside


def where_raised(exc: BaseException, source_file: Path | None) -> str:
    """``file:line`` of the innermost frame of ``exc``'s traceback in the user's file (or, for a
    package, beside it); without ``source_file``, the innermost frame outside importlib. A
    SyntaxError says where itself. Empty when no frame fits."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}" if exc.lineno else exc.filename
    every = list(traceback.extract_tb(exc.__traceback__))
    frames = _users(every, source_file) if source_file is not None \
        else [f for f in every if not f.filename.startswith("<frozen")]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def describe(exc: BaseException, source_file: Path | None) -> str:
    """``Type: message (at file:line)``, on one line."""
    message = exc.msg if isinstance(exc, SyntaxError) and exc.msg else str(exc)
    text = f"{type(exc).__name__}: {one_line(message)}" if message.strip() \
        else type(exc).__name__
    at = where_raised(exc, source_file)
    return f"{text} (at {at})" if at else text
