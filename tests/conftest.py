from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Cluster  # noqa: E402


@pytest.fixture
def cluster(tmp_path):
    """Factory of Clusters; every process they started is killed at teardown, pass or fail."""
    made: list[Cluster] = []

    def make(*args, **kwargs) -> Cluster:
        c = Cluster(tmp_path / f"cluster{len(made)}", *args, **kwargs)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
