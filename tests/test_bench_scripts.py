"""What the benchmarks compute from their measurements (pure functions of scripts/; no run)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_pull_takes_the_ideal_split_from_the_measured_speeds():
    """Slowdowns of 2x and 6x ask for 3 : 1, but the epochs measured alone decide: 4 s and
    10 s make an ideal of 1 / (1/4 + 1/10) s, with the samples split 2.5 : 1."""
    ideal, split = script("bench_pull").ideal_of(4.0, 10.0)
    assert ideal == pytest.approx(20 / 7) and split == pytest.approx(2.5)
