"""What the command-line tools share about their output: a reader that goes away
(``zbus-ctl settings | head``) ends the tool quietly, as it ends ``cat``, not with a
BrokenPipeError traceback."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
SIGPIPE_STATUS = 141   # what a shell reports for a program ended by SIGPIPE


def quiet_broken_pipe(main: F) -> F:
    """Wrap a tool's ``main``: when its output's reader has gone, exit with status 141 and
    say nothing (Python's advice: point stdout at /dev/null so that the interpreter's final
    flush does not fail again)."""
    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return main(*args, **kwargs)
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise SystemExit(SIGPIPE_STATUS) from None
    return run  # type: ignore[return-value]
