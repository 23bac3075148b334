"""zbus.heap: a role's heap keeps the memory of freed buffers for the next message's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from zbus.heap import keep_heap, operator_set

# Four 8 MiB buffers made, filled and freed, twenty times over: the minor page faults of one
# round after the first. glibc's defaults give the memory back each round (its heap's top is
# trimmed at twice a threshold of at most 32 MiB), so every round faults it in again.
ROUNDS = """
import resource, sys
import numpy as np
from zbus.heap import keep_heap
print(keep_heap() if sys.argv[1] == "keep" else "default")
def round_():
    held = [np.ones(1 << 20) for _ in range(4)]
    del held
round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    round_()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def faults_per_round(mode: str) -> tuple[str, float]:
    out = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0], float(out[1])


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_kept_heap_faults_no_page_in_again():
    kept, faults = faults_per_round("keep")
    assert kept == "True"
    # 8,192 pages a round were freed: none of them comes back by a fault
    assert faults < 64, faults


def test_the_operators_malloc_settings_win(monkeypatch):
    assert operator_set({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"})
    assert operator_set({"MALLOC_ARENA_MAX": "2"})
    assert not operator_set({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"})
    assert not operator_set({})
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    assert keep_heap() is False
