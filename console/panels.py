"""The console's panels. Each only displays: ``show(snapshot)`` lays out what control
published (``roles.algorithms.status`` describes the snapshot), nothing here talks to the bus."""

from __future__ import annotations

from collections import Counter

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, ProgressBar, Sparkline, Static

from console import format as fmt

# (header, the row's key it shows and sorts by); the id names the role, so the role has no
# column of its own (sorting by role is the default order)
NODE_COLUMNS = (("id", "role"), ("state", "state"), ("cpu%", "cpu"), ("mem", "rss"),
                ("in/s", "in_per_s"), ("out/s", "out_per_s"), ("smp/s", "samples_per_s"),
                ("queue", "backlog"), ("M", "round_samples"), ("beat", "beat_age_s"),
                ("host:pid", None), ("doing", None))


class NodeTable(DataTable):
    """Every node control knows, one row each; ``sort_by`` names the figure rows are sorted
    by (a header click or the ``o`` key changes it)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.sort_by = "role"
        self.rows_shown: list[dict] = []

    def on_mount(self) -> None:
        for label, _ in NODE_COLUMNS:
            self.add_column(label, key=label)

    def show(self, rows: list[dict]) -> None:
        # the highlighted node stays highlighted wherever the new order puts it
        selected = None
        if 0 <= self.cursor_row < len(self.rows_shown):
            selected = self.rows_shown[self.cursor_row]["id"]
        self.rows_shown = fmt.sort_nodes(rows, self.sort_by)
        self.clear()
        for r in self.rows_shown:
            self.add_row(
                r["id"], fmt.state(r["state"]), fmt.count(r["cpu"]), fmt.size(r["rss"]),
                fmt.size(r["in_per_s"]), fmt.size(r["out_per_s"]),
                fmt.count(r["samples_per_s"]), fmt.count(r["backlog"]),
                fmt.count(r["round_samples"]), fmt.age(r["beat_age_s"]),
                f"{r['host']}:{r['pid']}", r["doing"], key=r["id"])
        ids = [r["id"] for r in self.rows_shown]
        if selected in ids:
            self.move_cursor(row=ids.index(selected), scroll=False)

    def cycle_sort(self) -> str:
        keys = fmt.SORT_KEYS
        self.sort_by = keys[(keys.index(self.sort_by) + 1) % len(keys)]
        return self.sort_by


class ClusterPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static(id="gauges")
        yield Static(id="cluster-facts")

    def show(self, snap: dict) -> None:
        c = snap["cluster"]
        gauges = Text()
        gauges.append("network  ")
        gauges.append_text(fmt.gauge(c["net_util"], c["net_util_max"]))
        gauges.append(f" {c['net_util']:.3f} / max {c['net_util_max']:g}\n")
        gauges.append("failures ")
        gauges.append_text(fmt.gauge(c["failure_rate"], c["failure_rate_max"]))
        gauges.append(f" {c['failure_rate']:.3f} / max {c['failure_rate_max']:g}")
        self.query_one("#gauges", Static).update(gauges)
        in_flight = " (in flight)" if snap["round_in_flight"] else ""
        d = c["decision"]
        if d is not None:
            verdict = Text(f"round {d['round']}: ")
            verdict.append(d["reason"], style="green" if d["aggregate"] else "yellow")
            verdict.append(f" ({fmt.duration(d['age_s'])} ago)", style="dim")
        else:
            verdict = Text(f"sync mode {snap['sync']}: control does not decide rounds",
                           style="dim")
        latest = c["latest_backup"]
        backup = f", latest round {latest['round']}" if latest else ""
        states = Counter(r["state"] for r in snap["nodes"])
        facts = Text("\nnodes     ")
        for name in ("alive", "suspect", "failed", "left"):
            facts.append(f"{states[name]} {name}", style=fmt.STATE_STYLE[name][1]
                         if states[name] and name != "alive" else "")
            facts.append("  ")
        facts.append(f"\nworkers   {c['live_workers']} live     round {snap['round']}{in_flight}"
                     f"     rounds done {c['rounds_done']}\n")
        facts.append("decision  ")
        facts.append_text(verdict)
        facts.append(f"\ndecisions {c['decisions']['aggregate']} aggregate, "
                     f"{c['decisions']['wait']} wait\n")
        facts.append(f"backups   {c['backups']}{backup}     recoveries {c['recoveries']}\n")
        feeding = Text("paused by an operator", style="bold yellow") if snap["paused"] \
            else Text("running")
        facts.append("feeding   ")
        facts.append_text(feeding)
        self.query_one("#cluster-facts", Static).update(facts)


class TrainingPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static(id="epoch-line")
        yield ProgressBar(total=100, show_eta=False, id="epoch-progress")
        yield Static(id="throughput-line")
        yield Static("loss", id="loss-label", classes="plot-label")
        yield Sparkline([], id="loss-plot")
        yield Static(id="epochs-line", classes="plot-label")
        yield Sparkline([], id="auc-plot")
        yield Static("samples/s", classes="plot-label")
        yield Sparkline([], id="speed-plot")

    def show(self, snap: dict) -> None:
        t = snap["training"]
        epoch = snap["epoch"]
        shown = f"epoch {epoch + 1} of {snap['epochs']}" if epoch >= 0 else "not started"
        self.query_one("#epoch-line", Static).update(
            f"{shown}   phase {snap['phase']}   ETA epoch {fmt.duration(t['eta_epoch_s'])}, "
            f"job {fmt.duration(t['eta_job_s'])}")
        bar = self.query_one("#epoch-progress", ProgressBar)
        bar.update(total=max(1, t["samples_per_epoch"]),
                   progress=min(t["epoch_samples"], t["samples_per_epoch"]))
        losses = [x for x in t["history"]["loss"] if x is not None]
        last = f"{losses[-1]:.4f}" if losses else fmt.DASH
        self.query_one("#throughput-line", Static).update(
            f"throughput {fmt.count(t['samples_per_s'])} samples/s   trained "
            f"{fmt.count(t['samples_acked'])} samples   loss now {last}")
        self.query_one("#loss-plot", Sparkline).data = losses
        self.query_one("#speed-plot", Sparkline).data = t["history"]["samples_per_s"]
        done = [e for e in t["epochs"] if e.get("auc") is not None]
        line = "  ".join(f"{e['epoch'] + 1}: {e['auc']:.4f}" for e in done[-5:])
        self.query_one("#epochs-line", Static).update(
            "eval auc by epoch  " + (line or "no epoch evaluated yet"))
        self.query_one("#auc-plot", Sparkline).data = [e["auc"] for e in done]


class PartitionPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static(id="embedding-head")
        yield DataTable(id="shards", cursor_type="none")
        yield Static(id="tables-head")
        yield DataTable(id="tables", cursor_type="none")
        yield Static(id="model-partition")

    def on_mount(self) -> None:
        self.query_one("#shards", DataTable).add_columns(
            "shard", "keys", "keys/s", "share", "assigned", "capacity", "overflow", "moved in")
        self.query_one("#tables", DataTable).add_columns(
            "shard", "admitted", "rejected", "expired", "evicted")

    def show(self, snap: dict) -> None:
        e = snap["partition"]["embeddings"]
        skew = e.get("skew_aware")
        head = Text(f"embedding shards: {e['placement']} placement", style="bold")
        imbalance = f"   max/mean load {e['imbalance']:.2f}" if e.get("imbalance") else ""
        head.append(imbalance)
        if skew is None:
            head.append("\nskew-aware placement: not in use", style="dim")
        else:
            pause = skew.get("pause_s_last")
            head.append(
                f"\nkey map v{skew['version']} ({skew['phase']})   window {skew['window']}   "
                f"capacity {skew.get('capacity_source') or fmt.DASH}   "
                f"assigned max/mean {fmt.ratio(skew.get('imbalance_assigned'))}"
                f"\nmigrations {skew['migrations']}   keys moved "
                f"{fmt.count(skew['moved_keys'])}   last pause "
                f"{fmt.DASH if pause is None else f'{pause * 1000:.0f} ms'}   "
                f"history records {skew['records']}")
        self.query_one("#embedding-head", Static).update(head)
        table = self.query_one("#shards", DataTable)
        table.clear()
        for s in e["shards"]:
            share = f"{s['share']:.1%}" if s.get("share") is not None else fmt.DASH
            table.add_row(str(s["shard"]), fmt.count(s["keys"]), fmt.count(s["keys_per_s"]),
                          share, fmt.count(s.get("assigned")), fmt.count(s.get("capacity")),
                          fmt.count(s.get("overflow")), fmt.count(s.get("moved")))
        self.query_one("#tables-head", Static).update(bounds_text(e.get("bounds")))
        tables = self.query_one("#tables", DataTable)
        tables.clear()
        for s in e["shards"]:
            tables.add_row(str(s["shard"]), *(fmt.count(s.get(k)) for k in (
                "admitted", "rejected", "expired", "evicted")))
        self.query_one("#model-partition", Static).update(
            model_partition_text(snap["partition"].get("model")))


def bounds_text(bounds: dict | None) -> Text:
    """What keeps the shards' tables bounded (the job's ``[embeddings]``), in one line."""
    text = Text("embedding tables: ", style="bold")
    if bounds is None:
        text.append("not reported", style="dim")
        return text
    parts = []
    if bounds["min_count"] > 1:
        parts.append(f"min_count {bounds['min_count']} (sketch {bounds['sketch_mb']:g} MiB)")
    if bounds["expire_batches"]:
        parts.append(f"expire {fmt.count(bounds['expire_batches'])} batches")
    if bounds["expire_s"]:
        parts.append(f"expire {bounds['expire_s']:g} s")
    if bounds["max_rows_per_shard"]:
        parts.append(f"cap {fmt.count(bounds['max_rows_per_shard'])} keys")
    if parts:
        text.append(", ".join(parts))
    else:
        text.append("unbounded (a row on first sight, kept)", style="dim")
    return text


def model_partition_text(model: dict | None) -> Text:
    """The dense network's plan over a model-parallel group's devices, one line per part."""
    text = Text("model partition: ", style="bold")
    if model is None:
        text.append("not in use (every worker holds the whole dense network)", style="dim")
        return text
    bound = "in bound" if model.get("balanced") else "over bound"
    text.append(f"{model['parts']} parts per group")
    text.append(f"\ncut critical edges {model['cut_critical']} of {model['critical_edges']}  "
                f"cut edges {model['cut_edges']}  {fmt.count(model['bytes_per_step'])}B/step"
                f"  balance {fmt.ratio(model.get('balance'))} {bound}")
    total = sum(model["load"]) or 1.0
    for part, (load, nodes) in enumerate(zip(model["load"], model["nodes"], strict=True)):
        listed = ", ".join(nodes) or "none"
        text.append(f"\n  part {part}: load {load / total:5.1%}, {len(nodes)} sub-tasks: ")
        text.append(listed if len(listed) <= 38 else listed[:37] + "…", style="dim")
    return text
