"""The console's panels (the Cluster and Partition tabs, and the strip of tasks under way).
Each only displays: ``show(snapshot)`` lays out what control published
(``roles.protocol.status.StatusSnapshot``), called for the tab in view only;
``record(snapshot)``, where a panel has one, keeps its history from every status. Nothing
here talks to the bus. The
Nodes tab is ``console.nodes``, the Training tab ``console.training``."""

from __future__ import annotations

from collections import Counter, deque

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static

from console import format as fmt
from console.charts import Chart, series
from console.fill import FillBar
from roles.protocol.status import SERVER_GONE_S, ServerRow, StatusSnapshot

CLUSTER_POINTS = 300   # the Cluster tab's charts: one point per second of control's clock

class ClusterPanel(Vertical):
    """Network utilisation and failure rate against their thresholds (bars now, charts over
    the last minutes as this console saw them), the nodes' health, rounds, decisions,
    backups, the newest checkpoint and what the job waits for; once the job has ended, how
    (in place of the nodes' health and the feeding, which no longer run)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.points: deque[tuple[float, float, float, float, float]] = deque(
            maxlen=CLUSTER_POINTS)

    def compose(self) -> ComposeResult:
        yield Static(id="gauges")
        yield Static(id="cluster-facts")
        yield Static(id="serving-table")
        with Horizontal(id="cluster-charts"):
            yield Chart("network utilisation", "s since start", id="net-plot", from_zero=True)
            yield Chart("failure rate", "s since start", id="failure-plot", from_zero=True)

    def record(self, snap: StatusSnapshot) -> None:
        """Every status, shown or not: a point a second for the charts."""
        c, t = snap["cluster"], float(snap.get("uptime_s") or 0.0)
        if self.points and 0 <= t - self.points[-1][0] < 1.0 - 1e-6:
            return
        if self.points and t < self.points[-1][0]:
            self.points.clear()  # control started again
        self.points.append((t, c["net_util"], c["net_util_max"], c["failure_rate"],
                            c["failure_rate_max"]))

    def chart(self) -> None:
        times = [p[0] for p in self.points]
        self.query_one("#net-plot", Chart).show(
            [series("now", times, [p[1] for p in self.points]),
             series("max", times, [p[2] for p in self.points])])
        self.query_one("#failure-plot", Chart).show(
            [series("now", times, [p[3] for p in self.points]),
             series("max", times, [p[4] for p in self.points])])

    def show(self, snap: StatusSnapshot) -> None:
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
        final = snap.get("final")
        facts = Text("nodes      ")
        if final:
            facts = Text("ended      ")
            facts.append_text(fmt.final_line(final))
            facts.append(f"\nnodes      {len(snap['nodes'])} took part\n")
        else:
            states = Counter(r["state"] for r in snap["nodes"])
            for name in ("alive", "suspect", "failed", "left"):
                facts.append(f"{states[name]} {name}", style=fmt.STATE_STYLE[name][1]
                             if states[name] and name != "alive" else "")
                facts.append("  ")
            facts.append(f" {c['live_workers']} workers live\n")
        facts.append(f"rounds     round {snap['round']}{in_flight}, {c['rounds_done']} done   "
                     f"decisions {c['decisions']['aggregate']} aggregate, "
                     f"{c['decisions']['wait']} wait\n")
        facts.append("decision   ")
        facts.append_text(verdict)
        facts.append("\n")
        recovered = c.get("recovered")  # by kind (a status from before it was counted: none)
        facts.append(f"backups    {c['backups']}{backup}     recoveries "
                     f"{fmt.recoveries(c['recoveries'], recovered)}\n")
        if snap.get("checkpoint"):
            facts.append("checkpoint ")
            facts.append_text(fmt.checkpoint_line(snap["checkpoint"]))
            facts.append("\n")
        if final:
            feeding = Text(f"ended ({final['status']})", style="dim")
        elif snap["paused"]:
            feeding = Text("paused by an operator", style="bold yellow")
        else:
            feeding = Text("running")
        facts.append("feeding    ")
        facts.append_text(feeding)
        for w in [] if final else snap.get("waiting", []):
            facts.append("\nwaiting    ", style="bold yellow")
            facts.append(fmt.wait_line(w), style="bold yellow")
        self.query_one("#cluster-facts", Static).update(facts)
        servers = snap.get("serving") or []
        table = self.query_one("#serving-table", Static)
        table.display = bool(servers)   # (a job no server follows: nothing)
        if servers:
            table.update(serving_table(servers))
        self.chart()


def serving_table(rows: list[ServerRow]) -> Text:
    """The serving processes that follow the job, one line each: the version served and how
    old its parameters are, requests and rows per second, the infer latencies' p50 and p99;
    in red one that is not ready or not heard from for ``SERVER_GONE_S``."""
    text = Text("serving    server                          version        lag     req/s  "
                "rows/s   p50 ms   p99 ms\n", style="bold")
    for r in rows:
        lag = fmt.DASH if r["version_lag_s"] is None else f"{r['version_lag_s']:.1f} s"
        p50, p99 = (fmt.DASH if v is None else f"{v:.2f}" for v in (r["p50_ms"], r["p99_ms"]))
        gone = r["age_s"] > SERVER_GONE_S
        state = f"  gone {fmt.duration(r['age_s'])}" if gone else (
            "" if r["ready"] else "  not ready")
        text.append(f"           {r['server'][:30]:<30}  {r['version'][:12] or fmt.DASH:<12} "
                    f"{lag:>8}  {r['requests_per_s']:>8.1f} {r['rows_per_s']:>7.1f}  "
                    f"{p50:>7}  {p99:>7}",
                    style="")
        text.append(state + "\n", style="bold red" if state else "")
    return text


class TasksPanel(Vertical):
    """Long tasks under way (indexing, the statistics pass, an export, a checkpoint) as a
    progress bar, and what the job waits for; hidden when there is none."""

    def compose(self) -> ComposeResult:
        yield Static(id="tasks-line")
        yield FillBar(id="tasks-bar")

    def show(self, snap: StatusSnapshot) -> None:
        tasks = snap.get("tasks") or []
        waits = [] if snap.get("final") else snap.get("waiting") or []
        self.display = bool(tasks or waits)
        if not self.display:
            return
        text = Text()
        for w in waits:
            text.append("waiting for " + fmt.wait_line(w) + "\n", style="bold yellow")
        for task in tasks:
            text.append(f"{task['node']} {fmt.task_line(task)}\n")
        text.rstrip()  # in place
        self.query_one("#tasks-line", Static).update(text)
        bar = self.query_one("#tasks-bar", FillBar)
        known = [(t["done"] or 0.0, total) for t in tasks if (total := t["total"])]
        bar.display = bool(known)
        if known:
            bar.show(sum(min(done, total) for done, total in known),
                     sum(total for _, total in known))


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

    def show(self, snap: StatusSnapshot) -> None:
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
        self.query_one("#tables-head", Static).update(
            bounds_text(e.get("bounds")) + lists_text(e.get("fields") or []))
        tables = self.query_one("#tables", DataTable)
        tables.clear()
        for s in e["shards"]:
            tables.add_row(str(s["shard"]), fmt.count(s["admitted"]), fmt.count(s["rejected"]),
                           fmt.count(s["expired"]), fmt.count(s["evicted"]))
        self.query_one("#model-partition", Static).update(
            model_partition_text(snap["partition"].get("model")))


def lists_text(fields: list[dict]) -> Text:
    """The list fields' ids per sample and how often a list was full (older ids dropped), on
    a line of their own; nothing for a job without list fields."""
    lists = [f for f in fields if "max_len" in f]
    if not lists:
        return Text("")
    text = Text("\nlist fields: ", style="bold")
    text.append("   ".join(
        f"{f['field']} ({'sequence' if f['kind'] == 'sequence' else f['kind'][6:-1]}"
        f"{'' if f['table'] == f['field'] else ', table ' + f['table']}) "
        + (fmt.DASH if f.get("ids_per_sample") is None else
           f"{f['ids_per_sample']:.1f} ids, {f['at_max_len']:.0%} at {f['max_len']}")
        for f in lists))
    return text


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
