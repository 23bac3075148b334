"""The documentation stays true: the job file reference is what the schema prints, every key of
the summary is documented, and every relative link in README.md and docs/ points to a file (and a
heading) that exists."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*?\]\(([^)\s]+)\)")   # [^\]] takes newlines too
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def load_job_reference():
    spec = importlib.util.spec_from_file_location("job_reference",
                                                  ROOT / "scripts" / "job_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} +(.+?) *#*$", text, re.M)}


def links(page: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", page.read_text()))
    return [m.group(1) for m in LINK.finditer(text)]


def test_the_job_file_reference_is_what_the_schema_prints():
    committed = (ROOT / "docs" / "job-reference.md").read_text()
    assert load_job_reference().render() == committed, (
        "docs/job-reference.md is stale: run "
        "`.venv/bin/python scripts/job_reference.py > docs/job-reference.md`")


def test_every_job_key_has_a_one_line_description_and_its_range_in_the_reference():
    ref = load_job_reference()

    def walk(cls: type, path: str) -> None:
        for f, t in ref.settable(cls):
            doc = f.metadata.get("doc", "")
            assert doc and "\n" not in doc, f"{path}{f.name} needs a one-line metadata doc"
            if dataclasses.is_dataclass(t):
                walk(t, f"{path}{f.name}.")

    walk(ref.Job, "")
    text = ref.render()
    assert "| `net_util_max` | number | `0.3` | [0.001, 1.0]; live |" in text
    assert "| `curve` | string | `\"auto\"` | `\"auto\"`, `\"on\"`, `\"off\"` |" in text
    assert "| `workers` | integer | `2` | [1, 255] |" in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_a_file_and_heading_that_exist(page):
    found = links(page)
    assert found, f"{page.name} has no links"
    broken = []
    for target in found:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_docs_page_is_reachable_from_the_readme():
    readme = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")
              if t.startswith("docs/")}
    assert readme == {p.resolve() for p in PAGES[1:]}


def test_slugs_follow_github():
    assert slug("Embeddings: push or pull") == "embeddings-push-or-pull"
    assert slug("`[data.synthetic]`") == "datasynthetic"
    assert slug("Backups, recovery and export") == "backups-recovery-and-export"
    assert slug("Dense synchronisation: step, every, lazy") == \
        "dense-synchronisation-step-every-lazy"


def recovery_table() -> dict[str, list[str]]:
    """docs/architecture.md's table of the deaths each sync mode survives: row -> cells."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Recovery"):text.index("### A shard that dies")]
    rows = [line.strip("|").split("|") for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| process")]
    return {cells[0].strip(): [c.strip() for c in cells[1:4]] for cells in rows}


def test_the_recovery_table_says_what_the_sync_modes_allow():
    from roles.control import sync_modes
    table = recovery_table()
    columns = {"step": 0, "every": 1, "lazy": 1, "round": 2}
    modes = {"step": sync_modes.SyncMode, "every": sync_modes.EveryMode,
             "round": sync_modes.RoundMode, "lazy": sync_modes.LazyMode}
    for name, mode in modes.items():
        cell = columns[name]
        aggregator, feeder = table["an aggregator"][cell], table["the only (last) feeder"][cell]
        assert ("job fails" in aggregator) == (not mode.rules.aggregator_recovers), \
            (name, aggregator)
        assert ("job fails" in feeder) == (not mode.rules.feeder_restarts), (name, feeder)
        for survived in ("a worker (while another lives)", "a shard", "control"):
            assert "survived" in table[survived][cell], (name, survived)
    readme = (ROOT / "README.md").read_text()   # the opening names the same two exceptions
    assert "aggregator's in sync mode `step`" in readme
    assert "only feeder's in sync mode `round`" in readme
    assert "any process can be killed" not in readme.lower()


def test_the_partitioner_docs_give_the_codes_coarsening_target():
    from roles.model.partitioner import coarse_target
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert "max(16, 2K) sets" in text and coarse_target(8) == max(16, 2 * 8)
    assert "about 2 sets per part" not in text + (ROOT / "docs" / "benchmarks.md").read_text()


def test_every_key_of_the_summary_is_documented_under_run_files():
    """docs/operations.md's ``summary.json`` entry names every key of the summary's layout
    (``roles.job.summary.Summary``)."""
    import typing

    from roles.job.summary import Summary
    text = (ROOT / "docs" / "operations.md").read_text()
    entry = text[text.index("- `summary.json`"):text.index("- `metrics.jsonl`")]
    keys = typing.get_type_hints(Summary)
    assert len(keys) > 60, sorted(keys)
    assert [k for k in keys if f"`{k}`" not in entry] == []
