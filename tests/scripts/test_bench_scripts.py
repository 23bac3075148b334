"""What the benchmarks compute from their measurements (pure functions of scripts/; no run)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from harness import REPO

ROOT = REPO   # the checkout


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


def test_bench_models_jobs_are_what_it_says(tmp_path):
    """bench_models' jobs (no run): with lists, history is a sequence sharing the table item, and
    din attends from the candidate item (its default would be c0); without, neither list."""
    from roles.job.settings import parse_job

    bench = script("bench_models")
    tsv, cache = tmp_path / "items.tsv", tmp_path / "cache"
    din = parse_job(bench.items_job("din", tsv, True, 2, cache), environ={})
    layout = din.layout()
    assert layout.sequence_fields == ["history"] and layout.list_fields == ["genres", "history"]
    assert din.tables == {"item": ["item", "history"]} and din.model.options["candidate"] == "item"
    assert dict(zip(layout.fields, layout.widths, strict=True))["history"] == 20
    plain = parse_job(bench.items_job("mlp", tsv, False, 2, cache), environ={})
    assert plain.layout().list_fields == [] and "history" not in plain.sparse_fields
    criteo = parse_job(bench.criteo_job("dcn", tmp_path / "c.tsv", cache, [["C1", "C2"]]),
                       environ={})
    assert criteo.model.network == "dcn" and len(criteo.sparse_fields) == 26
    assert criteo.layout().derived_fields == []   # the crosses are wide_deep's alone
    wide = parse_job(bench.criteo_job("wide_deep", tmp_path / "c.tsv", cache,
                                      bench.crosses_of("C1*C2")), environ={})
    assert wide.layout().derived_fields[-1] == "cross:C1*C2"
    assert len(wide.layout().derived_fields) == 26 + 1


def test_bench_e2e_criteo_job_and_its_paired_ratios(tmp_path):
    """The Criteo case's job (no run): the layout, 2 workers / 2 shards, 1 epoch, batch 1024;
    a ratio above 1 means the cluster is the faster, in samples/s and in end-to-end time."""
    from types import SimpleNamespace

    from roles.job.settings import load_job

    bench = script("bench_e2e")
    data = tmp_path / "c.tsv"
    data.write_text("")
    job_file, settings = bench.criteo_case(SimpleNamespace(file=str(data), hidden="256,128"),
                                           tmp_path)
    job = load_job(str(job_file), environ={})
    assert len(job.sparse_fields) == 26 and len(job.dense_fields) == 13 and settings == {}
    assert (job.cluster.workers, job.cluster.shards, job.train.epochs) == (2, 2, 1)
    assert (job.train.batch_size, list(job.model.hidden)) == (1024, [256, 128])
    runs = [{"cluster": {"samples_per_s": 90.0, "end_to_end_s": 100.0},
             "one": {"samples_per_s": 100.0, "end_to_end_s": 150.0}},
            {"cluster": {"samples_per_s": 80.0, "end_to_end_s": 100.0},
             "one": {"samples_per_s": 100.0, "end_to_end_s": 200.0}},
            {"cluster": {"samples_per_s": 120.0, "end_to_end_s": 100.0},
             "one": {"samples_per_s": 100.0, "end_to_end_s": 120.0}}]
    assert bench.paired_ratio(runs, "one", "samples_per_s") == pytest.approx(0.9)
    assert bench.paired_ratio(runs, "one", "end_to_end_s") == pytest.approx(1.5)
    assert bench.median_of(runs, "one", "end_to_end_s") == 150.0


def test_bench_precision_job_is_the_criteo_layout(tmp_path):
    """bench_precision's network input (no timing): 26 fields of the width asked, 13 dense."""
    job = script("bench_precision").criteo_job("mlp", [256, 128], 16)
    layout = job.layout()
    assert len(layout.fields) == 26 and set(layout.dims) == {16}
    assert len(job.dense_fields) == 13 and job.model.hidden == [256, 128]


@pytest.mark.integration   # a Python process of its own, with scripts/ on its path
def test_every_script_imports():
    """A benchmark whose import broke says so here, not when someone runs it (bench_lag's
    had, for a helper moved out of bench_drift). One process: the scripts import each other
    from ``scripts/``, as they do when run."""
    code = """
import importlib, pathlib, sys
root = pathlib.Path(sys.argv[1])
sys.path.insert(0, str(root))
bad = []
for p in sorted(root.glob("*.py")):
    try:
        importlib.import_module(p.stem)
    except BaseException as exc:
        bad.append(f"{p.name}: {type(exc).__name__}: {exc}")
print("\\n".join(bad))
"""
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "scripts")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
