"""The job: one frozen settings object read from a TOML job file and ``ZBUS_*`` variables.

The job file comes from ``--job``, else ``ZBUS_JOB``, else the built-in default job
(``roles/job/default_job.toml``: synthetic data). Any key can be overridden from the environment as
``ZBUS_<SECTION>__<KEY>`` (``ZBUS_TRAIN__EPOCHS=1``, ``ZBUS_DATA__SYNTHETIC__ROWS=5000``); the
value is read as a TOML value, or as a plain string when it is not one. Relative data paths in
the job file are relative to the job file; in the environment, to the working directory.

Every mistake (unknown key, wrong type, value out of range) is a ``JobError`` naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import os
import tomllib
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from roles.job.fields import SYNTHETIC_ITEM_FIELDS, FieldLayout, LayoutError
from roles.job.module_file import module_at, module_path
from roles.job.stream_settings import StreamConfig
from roles.job.sync_rules import SYNC_MODES, cluster_refusal
from roles.protocol.topology import ClusterConfig

NETWORKS = ("mlp", "dlrm", "dcn", "deepfm", "wide_deep", "din", "shared_bottom", "mmoe", "ple",
            "esmm")
POOLINGS = ("mean", "sum", "none")
# networks with a weight per id (the wide part, the first order): their layout has a ``wide:``
# field for every sparse field (``roles.job.fields``), and wide_deep a ``cross:`` field per cross
PER_ID_NETWORKS = ("wide_deep", "deepfm")
MAX_LEN = 50   # a list field's ids kept by default (the newest)
CHAIN = ("click", "purchase")   # the labels of [data.synthetic] conversion
DECAY_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}
RESERVED_ENV = {"ZBUS_JOB", "ZBUS_RUN_DIR", "ZBUS_LOG_LEVEL", "ZBUS_VENV", "ZBUS_TORCH_SPEC",
                "ZBUS_CACHE_DIR", "ZBUS_CLUSTER_FILE", "ZBUS_BIND_INTERFACE", "ZBUS_RESUME",
                "ZBUS_SUPERVISED", "ZBUS_HEALTH_FILE", "ZBUS_POD_NAME", "ZBUS_SIGTERM"}


class JobError(ValueError):
    """A job file or override that cannot be run; the message names the key."""


def _list(*items: Any, doc: str) -> Any:
    return field(default_factory=lambda: list(items), metadata={"doc": doc})


# Every settable field carries metadata "doc", its one-line meaning: scripts/job_reference.py
# prints docs/job-reference.md from these fields (types, defaults, min/max/choices/live, doc).


@dataclass(frozen=True)
class SyntheticConfig:
    """The built-in generator: Zipf-popular categorical values and log-normal counts, labels
    drawn from a planted logistic model (its probabilities give the oracle AUC)."""

    rows: int = field(default=100_000, metadata={"min": 100, "doc": "rows generated"})
    vocab: list[int] = _list(10, 20, 50, 100, 200, 500, 1000, 2000, doc=(
        "distinct values of each categorical field (one field per entry)"))
    dense: int = field(default=4, metadata={"min": 0, "max": 1000,
                                            "doc": "log-normal count columns"})
    zipf: float = field(default=1.1, metadata={"min": 0.0, "doc": (
        "popularity exponent: the value of rank k has probability ∝ k^-zipf")})
    signal: float = field(default=0.6, metadata={"min": 0.0, "doc": (
        "standard deviation of the planted per-value and per-column weights (logit units)")})
    days: int = field(default=30, metadata={"min": 1, "doc": (
        "timestamps rise through the rows over this many days")})
    seed: int = field(default=1, metadata={"doc": "generator seed"})
    items: int = field(default=0, metadata={"min": 0, "doc": (
        "with N > 0, three more fields: `item` (the candidate, N values), `genres` (a list "
        "of 1–3 of the item's genres) and `history` (a sequence of up to `history` items "
        "the user clicked, sharing the table `item`); the planted model scores the "
        "candidate's affinity with the history (what `din` learns) and its genres")})
    history: int = field(default=20, metadata={"min": 1, "max": 4096, "doc": (
        "the longest `history` generated (with `items`)")})
    genres: int = field(default=40, metadata={"min": 1, "doc": (
        "distinct genres (with `items`)")})
    drift: float = field(default=0.0, metadata={"min": 0.0, "doc": (
        "radians a day the planted weights of the values (and items) turn with event time: "
        "two days k apart correlate cos(drift × k), so the best model changes and one that "
        "stops learning falls behind; 0: the same model throughout")})
    conversion: bool = field(default=False, metadata={"doc": (
        "two labels, a planted chain: `click` (the planted model above) and `purchase`, 1 only "
        "on a clicked row, with a probability given the click from a second planted model "
        "over the same values (and half the click's logit); the job's labels are then "
        "`[\"click\", \"purchase\"]`, each with its oracle AUC")})

    def __post_init__(self) -> None:
        if not self.vocab or min(self.vocab) < 1:
            raise ValueError("[data.synthetic] vocab must list one size >= 1 per sparse field")


@dataclass(frozen=True)
class DataConfig:
    source: str = field(default="file", metadata={"choices": ("file", "synthetic"), "doc": (
        "`file`, or `synthetic` (the built-in generator, `[data.synthetic]`)")})
    path: str = field(default="", metadata={"doc": (
        "a file, a directory (its files named as the format's: `*.csv`, `*.tsv`, ...; see "
        "operations.md) or a glob (several files, sorted; `.gz` is read transparently); "
        "relative to the job file (to the working directory when set from the environment); "
        "or an `s3://bucket/key` URI (an object, a prefix's objects, or a glob in its last "
        "name; AWS credentials and `AWS_ENDPOINT_URL` from the environment); required when "
        "`source = \"file\"`")})
    eval_path: str = field(default="", metadata={"doc": (
        "the eval rows in files of their own (a file, directory or glob, as `path`); empty: "
        "the last `eval_fraction` of `path`'s data")})
    format: str = field(default="csv", metadata={
        "choices": ("csv", "tsv", "criteo", "parquet"), "doc": (
            "`csv` (header row, `\"`-quoting), `tsv` (header row), `criteo` (no header: label, "
            "I1–I13, C1–C26, tab-separated), one record per line; or `parquet` (columns by "
            "name)")})
    label: str = field(default="label", metadata={"doc": "label column"})
    labels: list[str] = _list(doc=(
        "several label columns in place of `label`, one task each (multi-task: "
        "docs/models.md#several-labels); a row's missing value masks that task for the row, "
        "a row with none is rejected; the first is the primary task (the summary's `auc`)"))
    positive: list[str] = _list(doc=(
        "label values that mean 1; empty: the label is a number, positive when > 0"))
    negative: list[str] = _list(doc=(
        "label values that mean 0; when given, any other label value is rejected"))
    weight: str = field(default="", metadata={"doc": (
        "optional column of sample weights (a number >= 0 on every row; a missing or negative "
        "one rejects the row): a training sample's weight is this times its decay weight; the "
        "eval rows' (`eval_path`'s files too need the column) are read, not used: they are "
        "scored unweighted")})
    negative_rate: float = field(default=1.0, metadata={"min": 1e-6, "max": 1.0, "doc": (
        "negative down-sampling: keep this share of the training rows whose label is 0, the "
        "same rows every epoch (by a hash of the row's values); every probability that "
        "leaves zbus (eval, zbus-predict, zbus-serve) is corrected for it, p / (p + (1 − p) / "
        "rate); 1: keep all; one label only")})
    timestamp: str = field(default="", metadata={"doc": (
        "optional column of unix seconds or ISO 8601 dates/times (rows without a valid one "
        "are rejected)")})
    dense: list[str] = _list(doc="numeric columns (criteo: I1–I13 when empty)")
    sparse: list[str] = _list(doc=(
        "categorical columns, at least one (criteo: C1–C26 when empty); no column twice"))
    lists: dict[str, str] = field(default_factory=dict, metadata={"doc": (
        "sparse fields that hold several ids, each with its separator in text formats "
        "(`{ genres = \"|\" }`; a Parquet `list<>` column needs none, give `\"\"`); an empty "
        "value is an empty list; an empty id inside a list rejects the row")})
    tables: dict[str, list[str]] = field(default_factory=dict, metadata={"doc": (
        "embedding tables shared by several sparse fields (`item = [\"movie_id\", "
        "\"history\"]`): the same id in those fields is the same key and the same row; a "
        "field in no table has a table of its own, named as the field")})
    eval_fraction: float = field(default=0.2, metadata={"min": 0.01, "max": 0.9, "doc": (
        "the eval split (without `eval_path`): plain text files, the rows from the first line "
        "start at or after the last fraction of the data's bytes (after the headers, in file "
        "order: no count of the rows before the first batch); with a gzipped or Parquet file, "
        "the last fraction of the rows in file order")})
    shuffle_buffer: int = field(default=262_144, metadata={"min": 1, "doc": (
        "training samples a feeder shuffles in, shared by the parts it reads at a time: each "
        "batch is drawn at random from its part's share; a part no larger is shuffled whole")})
    part_mb: float = field(default=0.0, metadata={"min": 0.0, "doc": (
        "about how many MiB of a file one part holds (the unit feeders read and control hands "
        "out; a gzipped file is one part, Parquet parts are whole row groups); 0: the data's "
        "size / 64, within 4 to 64 MiB")})
    parts_open: int = field(default=4, metadata={"min": 1, "max": 64, "doc": (
        "parts a feeder reads at a time, taking their batches in turn (each shuffles in "
        "shuffle_buffer / parts_open samples); a feeder reads its parts in a new random order "
        "every epoch")})
    part_rows: int = field(default=262_144, metadata={"min": 1, "doc": (
        "rows of one part of synthetic data")})
    stats_rows: int = field(default=250_000, metadata={"min": 1, "doc": (
        "training rows the dense statistics are taken from: the first stats_rows / parts of "
        "each training part (every row when decay needs the newest time); the job's first "
        "batch waits for them")})
    cache_dir: str = field(default="runs/cache", metadata={"doc": (
        "where the data's index and statistics are cached between runs (ZBUS_CACHE_DIR "
        "overrides); relative to the working directory")})
    hold_mb: float = field(default=256.0, metadata={"min": 0.0, "doc": (
        "a job of more than one epoch: each feeder keeps the parts it has read, parsed (keys "
        "hashed), in memory up to this many MiB, and later passes prepare them from there "
        "rather than reading and parsing their files again; the parts that do not fit are "
        "read every pass; 0: never")})
    log1p: bool = field(default=True, metadata={"doc": (
        "transform each dense value x to sign(x)·log1p(|x|) before standardising")})
    max_rejected_fraction: float = field(default=0.1, metadata={"min": 0.0, "max": 1.0, "doc": (
        "more rejected rows than this fraction stops the job (the schema is probably wrong)")})
    decay_base: float = field(default=1.0, metadata={"min": 1.0, "max": 1e6, "doc": (
        "training sample weight = decay_base^-age (1: no decay; > 1 needs `timestamp`, or "
        "synthetic data)")})
    decay_unit: str = field(default="day", metadata={"choices": tuple(DECAY_UNITS), "doc": (
        "unit of age and of merging buckets")})
    drop_below: float = field(default=0.001, metadata={"min": 0.0, "max": 1.0, "doc": (
        "training samples whose decayed weight is below this are dropped (counted)")})
    merge: bool = field(default=False, metadata={"doc": (
        "merge identical training samples of one time unit into one, of weight decay × count")})
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig, metadata={"doc": (
        "the built-in generator, used when `source = \"synthetic\"`")})

    def __post_init__(self) -> None:
        if self.source != "file":
            return
        if self.decay_base > 1.0 and not self.timestamp:
            raise ValueError("[data] decay_base > 1 needs a timestamp column ([data] timestamp)")
        if self.format != "criteo" and not self.sparse:
            raise ValueError("[data] sparse must name at least one categorical column")
        if self.labels and self.label != "label":
            raise ValueError("[data] label and labels: name the label columns in one of them")
        if self.labels and self.format == "criteo":
            raise ValueError("[data] labels: the criteo format has one label column")
        names = [*self.tasks, *self.dense, *self.sparse] + \
            ([self.timestamp] if self.timestamp else []) + ([self.weight] if self.weight else [])
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup and self.format != "criteo":
            raise ValueError(f"[data] column(s) {', '.join(dup)} used twice")
        if self.format == "criteo" and self.lists:
            raise ValueError("[data] lists: the criteo format has no list fields")

    @property
    def tasks(self) -> list[str]:
        """The label columns, one per task (``labels``, else ``label`` alone)."""
        return list(self.labels) if self.labels else [self.label]


@dataclass(frozen=True)
class ModelConfig:
    network: str = field(default="mlp", metadata={"choices": NETWORKS, "doc": (
        "a built-in network: `mlp` (embeddings and dense features concatenated into an MLP), "
        "`dlrm`, `dcn` (DCN-v2), `deepfm`, `wide_deep` or `din` (docs/models.md); for several "
        "labels (`[data] labels`) also `shared_bottom`, `mmoe`, `ple` or `esmm` "
        "(docs/models.md#several-labels); exclusive with `module`")})
    module: str = field(default="", metadata={"doc": (
        "your own network instead: `path/to/file.py:factory` (relative to the job file) or "
        "`package.module:factory`, meeting the contract of docs/models.md")})
    weights_per_id: bool = field(default=False, metadata={"doc": (
        "give the network a weight per id of every sparse field (`sparse[\"wide:<field>\"]`, "
        "one per label) and per tuple of `[model.options] crosses` (`cross:<a>*<b>`): "
        "memorisation, as a wide part (docs/models.md#weights-per-id); `wide_deep` and "
        "`deepfm` always have them")})
    embedding_dim: int = field(default=16, metadata={"min": 1, "max": 4096, "doc": (
        "embedding width of every table that `dims` does not name")})
    hidden: list[int] = _list(128, 64, doc=(
        "hidden layers (ReLU) of the built-in networks' deep part"))
    dims: dict[str, int] = field(default_factory=dict, metadata={"doc": (
        "embedding width per table (a table of `[data.tables]`, or a field's own)")})
    pooling: dict[str, str] = field(default_factory=dict, metadata={"doc": (
        "per list field: `mean` (the default), `sum`, or `none` (a sequence: the network gets "
        "[batch, max_len, dim], zero padded, and its lengths)")})
    max_len: dict[str, int] = field(default_factory=dict, metadata={"doc": (
        f"per list field: keep the newest (last) N ids (default {MAX_LEN})")})
    tasks: dict[str, float] = field(default_factory=dict, metadata={"doc": (
        "the loss weight of each label of `[data] labels` (default 1 each): the loss is the "
        "sum over tasks of weight × the task's sample-weighted BCE over the rows it is present "
        "in")})
    options: dict[str, Any] = field(default_factory=dict, metadata={"doc": (
        "passed to the network's factory as they are (numbers, strings, booleans or lists; "
        "the built-ins' options: docs/models.md)")})

    def __post_init__(self) -> None:
        if any(h < 1 for h in self.hidden):
            raise ValueError("[model] hidden sizes must be >= 1")
        if self.module and self.network != "mlp":
            raise ValueError("[model] network and module are exclusive: name one")
        if self.module and ":" not in self.module:
            raise ValueError(f"[model] module must be \"file.py:factory\" or "
                             f"\"package.module:factory\", got {self.module!r}")
        for name, dim in self.dims.items():
            if not 1 <= dim <= 4096:
                raise ValueError(f"[model.dims] {name} must be within 1 and 4096, got {dim}")
        for name, how in self.pooling.items():
            if how not in POOLINGS:
                raise ValueError(f"[model.pooling] {name} must be one of "
                                 f"{', '.join(map(repr, POOLINGS))}, got {how!r}")
        for name, n in self.max_len.items():
            if not 1 <= n <= 4096:
                raise ValueError(f"[model.max_len] {name} must be within 1 and 4096, got {n}")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = field(default=3, metadata={"min": 1, "max": 4095, "doc": (
        "passes over the training split")})
    batch_size: int = field(default=256, metadata={"min": 1, "max": 1 << 20, "doc": (
        "samples per batch")})
    eval_batch_size: int = field(default=0, metadata={"min": 0, "max": 1 << 20, "doc": (
        "samples per evaluation batch; 0: four times `batch_size`, at most 16,384 (but never "
        "below `batch_size`): scoring has no backward pass and no update, so a bigger batch "
        "spreads each batch's messages over more rows")})
    sync: str = field(default="every", metadata={"choices": tuple(SYNC_MODES), "doc": (
        "dense synchronisation; a stream job ([stream]) that does not set it gets `step`: "
        "each event is scored by the weights every earlier batch trained (docs/streams.md)")})
    sync_every: int = field(default=8, metadata={"min": 1, "doc": (
        "local steps per worker before it is ready for a round (`every`); steps in a local "
        "round (`lazy`)")})
    round_iterations: int = field(default=32, metadata={"min": 1, "doc": (
        "batches per worker in a round (`round`): a round is `workers × round_iterations` "
        "batches")})
    dense_lr: float = field(default=1e-3, metadata={"min": 0.0, "doc": (
        "Adam learning rate of the dense network")})
    embedding_lr: float = field(default=0.05, metadata={"min": 0.0, "doc": (
        "Adagrad learning rate of the embeddings")})
    embedding_optimizer: str = field(default="rowwise_adagrad", metadata={
        "choices": ("adagrad", "rowwise_adagrad"), "doc": (
            "the embeddings' sparse optimizer: `rowwise_adagrad` keeps one sum of squared "
            "gradients per row (the mean over its table's values, as FBGEMM's and TorchRec's "
            "exact row-wise Adagrad), 4 bytes a key; `adagrad` one per value, 4 × the row's "
            "width: at width 16 a shard holds about 40% more a key for the same AUC on the "
            "Criteo layout (docs/benchmarks.md)")})
    embedding_init: float = field(default=0.05, metadata={"min": 0.0, "doc": (
        "new embedding rows are uniform in ±this")})
    prefetch: int = field(default=2, metadata={"min": 1, "max": 64, "doc": (
        "batches a worker pulls ahead of the one it trains (small keeps the queue fair); "
        "`prefetch` + 1 also bounds a worker's connections to each sample queue, which it "
        "opens as the measured round trip to its feeder needs (one carries about half a "
        "batch per round trip)")})
    grants_ahead: int = field(default=2, metadata={"min": 1, "max": 64, "doc": (
        "the least batches a worker asks its feeder for (Taken -> Grant) ahead of the one it "
        "trains; it asks for more when the measured round trip to the feeder is longer than "
        "its batches (ceil(rtt / batch time) + 1), never more than `prefetch` + 1: more hides "
        "a longer round trip, and in mode `push` the shards send those batches' rows early; "
        "each batch a slow worker holds granted is one the feeder cannot give an idle worker "
        "at the end of a pass")})
    embeddings: str = field(default="push", metadata={"choices": ("push", "pull"), "doc": (
        "`push`: the feeder's grant of a batch tells the shards which worker trains it, and "
        "they send it the rows unasked; `pull`: the worker asks every shard when it is about "
        "to train the batch; a stream job ([stream]) that does not set it gets `pull`: rows "
        "pushed at the grant miss the updates of the batches trained meanwhile, which costs "
        "test-then-train AUC (docs/streams.md)")})
    batch_by_label: bool = field(default=False, metadata={"doc": (
        "every training batch holds samples of one label, the labels' batches interleaved")})
    device: str = field(default="auto", metadata={"choices": ("auto", "cpu", "cuda"), "doc": (
        "`auto`: CUDA when present, else CPU")})
    precision: str = field(default="fp32", metadata={"choices": ("fp32", "bf16"), "doc": (
        "the dense network's arithmetic: `fp32`, or `bf16`: its forward (and so its backward) "
        "under torch's autocast to bfloat16 (matrix products in bfloat16; weights, their "
        "updates, the loss and the embeddings' gradients stay float32), about twice as fast "
        "on CPUs with AVX512-BF16 or AMX and on CUDA devices with bfloat16, slower where the "
        "CPU has neither (the worker says so in its log); the references train the same way; "
        "not with model parallelism (`[cluster] parts` > 1)")})
    torch_threads: int = field(default=0, metadata={"min": 0, "doc": (
        "torch threads per worker; 0: on one host, the cores left after the feeder and the "
        "shards (one each), shared by the workers; across hosts, the host's cores less one for "
        "each feeder and shard whose endpoint is on the worker's host (set it when workers "
        "share a host)")})
    shuffle: bool = field(default=True, metadata={"doc": (
        "shuffle the training rows every epoch (seeded)")})
    seed: int = field(default=7, metadata={"doc": (
        "seeds model initialisation, embedding rows and shuffling")})
    stall_timeout_s: float = field(default=300.0, metadata={"min": 1.0, "doc": (
        "fail the job when nothing progresses this long (the reason names the last "
        "aggregation decision)")})
    until_events: int = field(default=0, metadata={"min": 0, "doc": (
        "a stream job ([stream]) ends once this many events are trained (the batches in "
        "flight then finish too); 0: no such end")})
    until_s: float = field(default=0.0, metadata={"min": 0.0, "doc": (
        "a stream job ends once it has trained this many seconds; 0: no such end (without "
        "either it runs until `zbus-ctl stop` or Ctrl-C)")})
    recovery_timeout_s: float = field(default=120.0, metadata={"min": 1.0, "doc": (
        "how long the job waits for a killed aggregator, shard or (last) feeder to be "
        "started again")})

    @property
    def eval_batch(self) -> int:
        """Samples per evaluation batch (``eval_batch_size``, 0 resolved)."""
        return self.eval_batch_size or max(self.batch_size, min(4 * self.batch_size, 16_384))


@dataclass(frozen=True)
class CheckpointConfig:
    """Whole-job checkpoints (``roles.control.checkpoints``): a consistent cut of the dense
    weights, every shard's rows and Adagrad state, the feeders' positions and control's state,
    from which the job resumes after every process was killed (``zbus-control --resume``) and
    a restarted shard restores its rows."""

    every_s: float = field(default=60.0, metadata={"min": 0.0, "doc": (
        "seconds between checkpoints, counted from the end of the previous one (0: only when "
        "an operator asks, `zbus-ctl checkpoint`); the most training a crash of the whole job "
        "or of a shard can undo")})
    keep: int = field(default=2, metadata={"min": 1, "max": 1000, "doc": (
        "newest complete checkpoints kept (with the older files their shards' incremental "
        "files build on)")})
    full_every: int = field(default=8, metadata={"min": 1, "max": 10_000, "doc": (
        "a shard writes its whole table every this many checkpoints, and only the rows "
        "changed since its previous file in between")})
    timeout_s: float = field(default=120.0, metadata={"min": 1.0, "doc": (
        "a checkpoint not complete this long after it began is abandoned (training goes "
        "on; the next one is tried after `every_s`)")})
    dir: str = field(default="", metadata={"doc": (
        "where the checkpoints go: a directory (relative to the job file), or an object "
        "store's `s3://bucket/prefix` (credentials and endpoint from the AWS variables: "
        "docs/operations.md, on object storage); empty: the run directory's `checkpoints/`. "
        "Give each run a directory of its own: a resumed run reads the newest checkpoint "
        "there")})
    export: bool = field(default=True, metadata={"doc": (
        "export the model when the job ends, and when an operator asks (`zbus-ctl export`); "
        "false: no export, the job ends after its last evaluation (its figures in the "
        "summary)")})
    export_dir: str = field(default="", metadata={"doc": (
        "where the model is exported (`export/`, and `export-<n>/` for `zbus-ctl export`): a "
        "directory (relative to the job file) or an `s3://bucket/prefix`; empty: `dir` when "
        "that is an object store's URI (every node writes its part there), else the run "
        "directory")})

    def export_root(self, run_dir: str) -> str:
        """Where the exports go (``export/``, ``export-<n>/`` under it): ``export_dir``, else
        the checkpoint store when it is an object store (every node reaches it), else the
        run directory."""
        from roles.storage.fs import is_uri
        return self.export_dir or (self.dir if is_uri(self.dir) else run_dir)

    def exports_to_run_dir(self) -> bool:
        """The exports go to the run directory: each node writes its part into its own."""
        return self.export and not self.export_root("")


@dataclass(frozen=True)
class EmbeddingsConfig:
    """Keeping the shards' tables bounded (``roles.algorithms.shard.admission`` and
    ``roles.algorithms.shard.expiry``): a key gets a row of its own only after ``min_count``
    sightings (until then it shares its field's default row), rows not looked up for a while
    are dropped, and a shard holds at most ``max_rows_per_shard`` keys."""

    min_count: int = field(default=1, metadata={"min": 1, "max": 255, "doc": (
        "a key gets its own row at its min_count-th sighting in training batches (counted per "
        "shard in a count-min sketch); until then it maps to its field's shared default row; "
        "1: every key on first sight")})
    sketch_mb: float = field(default=16.0, metadata={"min": 0.0625, "max": 4096.0, "doc": (
        "memory of each shard's count-min sketch (4 rows of 8-bit counters, rounded down to a "
        "power of two); a key must reach min_count within about the last sketch_mb × 2^18 "
        "sightings of keys without a row (the counters are halved that often, and with expiry "
        "on also once per expiry horizon); used only when min_count > 1")})
    expire_batches: int = field(default=0, metadata={"min": 0, "doc": (
        "drop a key's row when the shard has looked up this many batches without it (swept "
        "in pieces, up to an eighth late); 0: never")})
    expire_s: float = field(default=0.0, metadata={"min": 0.0, "doc": (
        "drop a key's row when it was not looked up for this many seconds (up to an eighth "
        "late); 0: never")})
    max_rows_per_shard: int = field(default=0, metadata={"min": 0, "doc": (
        "a shard holding more keys evicts the least recently looked up, down to 1/16 below "
        "this; about 155 bytes a key at embedding_dim 16; 0: no cap")})


@dataclass(frozen=True)
class AggregationConfig:
    """Sync mode lazy: when control lets the workers' dense weights be combined, and when the
    aggregator backs the result up. Every key marked ``live`` can be changed while the job runs
    (``zbus-ctl set``, the console); see ``roles.algorithms.shared.live``."""

    net_util_max: float = field(default=0.30, metadata={"min": 0.001, "max": 1.0, "live": True,
                                                        "doc": (
        "`lazy` aggregates only while the cluster's network utilisation is below this")})
    failure_rate_max: float = field(default=0.05, metadata={
        "min": 0.001, "max": 1.0, "live": True, "doc": (
            "… and its failure rate (nodes that crashed or answered a probe late within "
            "`failure_window_s` ÷ the job's nodes in that window) is below this")})
    probe_timeout_s: float = field(default=3.0, metadata={
        "min": 0.05, "max": 600.0, "live": True, "doc": (
            "a probe unanswered this long counts as failed")})
    failure_window_s: float = field(default=30.0, metadata={
        "min": 0.1, "max": 3600.0, "doc": (
            "the failure rate's sliding window: a crash or a late probe counts this long "
            "(not live)")})
    min_local_rounds: int = field(default=4, metadata={
        "min": 1, "max": 10_000, "live": True, "doc": (
            "… and every live worker did this many local rounds (≤ `max_local_rounds`)")})
    max_local_rounds: int = field(default=16, metadata={
        "min": 1, "max": 10_000, "live": True, "doc": (
            "a worker that did this many local rounds without an aggregation waits")})
    backup_change_min: float = field(default=0.05, metadata={
        "min": 0.0, "max": 100.0, "live": True, "doc": (
            "back up after an aggregation when the weights moved this much (relative L2 "
            "change) since the last backup")})
    backups_kept: int = field(default=3, metadata={
        "min": 1, "max": 1000, "live": True, "doc": "newest backups kept"})

    def __post_init__(self) -> None:
        if self.min_local_rounds > self.max_local_rounds:
            raise ValueError("[aggregation] min_local_rounds must be <= max_local_rounds")


@dataclass(frozen=True)
class PlacementConfig:
    """Where embedding keys live (``roles.algorithms.control.placement``): ``hash`` (key mod
    shards, fixed) or ``skew`` (heavy keys and buckets of light keys placed by predicted shard
    capacity each allocation window, moved between shards while the job runs)."""

    mode: str = field(default="hash", metadata={"choices": ("hash", "skew"), "doc": (
        "`hash` (key mod shards, fixed) or `skew` (placed by predicted capacity, moved while "
        "the job runs)")})
    window_batches: int = field(default=50, metadata={"min": 0, "doc": (
        "allocation window: this many training batches per feeder; 0: one window per epoch")})
    heavy_keys: int = field(default=4096, metadata={"min": 1, "max": 1 << 20, "doc": (
        "SpaceSaving counters per feeder and window (the keys placed one by one)")})
    buckets_per_shard: int = field(default=64, metadata={"min": 1, "max": 4096, "doc": (
        "buckets of light keys per shard (the unit in which the tail moves)")})
    min_windows: int = field(default=3, metadata={"min": 1, "doc": (
        "windows of history before the capacity predictor is used")})
    min_gain: float = field(default=0.10, metadata={"min": 0.0, "max": 1.0, "doc": (
        "adopt a new map only when it lowers the predicted max load ÷ capacity by more than "
        "this fraction")})
    capacities: list[float] = _list(doc=(
        "relative capacity per shard before history exists (one positive figure per shard); "
        "empty: equal"))
    predictor_steps: int = field(default=300, metadata={"min": 1, "max": 100_000, "doc": (
        "Adam steps of the predictor's first training (a fifth on each retraining)")})
    history_windows: int = field(default=256, metadata={"min": 1, "max": 100_000, "doc": (
        "the predictor trains on the newest this many windows of history (its cost stays "
        "flat as the job runs)")})
    drain_timeout_s: float = field(default=10.0, metadata={"min": 0.1, "doc": (
        "a shard hands over (a migration), or takes its checkpoint snapshot, after this long "
        "even if a held batch's gradients never came (counted)")})

    def __post_init__(self) -> None:
        if any(not c > 0 for c in self.capacities):
            raise ValueError("[placement] capacities must be positive")
        if self.min_windows > self.history_windows:
            raise ValueError("[placement] min_windows must be <= history_windows")


@dataclass(frozen=True)
class PartitionConfig:
    """How the network is split over the ``[cluster] parts`` processes of a model-parallel
    group (``roles.model.partitioner``): an edge is critical when its tensor is larger than
    ``critical_bytes`` or (``critical_path``) it lies on the longest path of the graph."""

    critical_bytes: float = field(default=float(1 << 20), metadata={"min": 0.0, "doc": (
        "an edge whose tensor is larger (in bytes) is critical")})
    critical_path: bool = field(default=True, metadata={"doc": (
        "the edges of the longest path are critical too")})
    balance: float = field(default=1.2, metadata={"min": 1.0, "max": 100.0, "doc": (
        "bound on max part load ÷ mean load (FLOPs)")})
    threshold: float = field(default=-0.5, metadata={"min": -1000.0, "max": 1000.0, "doc": (
        "a boundary sub-task moves when second gain − first gain exceeds this")})
    target: str = field(default="every", metadata={"choices": ("every", "flow"), "doc": (
        "where it moves: the best other part (`every`) or the first in flow order among its "
        "neighbours' parts (`flow`)")})
    pick: str = field(default="gain", metadata={"choices": ("gain", "flow"), "doc": (
        "which boundary sub-task moves first: the one with the largest gain (`gain`) or the "
        "first in flow order (`flow`, the method's choice)")})
    tries: int = field(default=8, metadata={"min": 1, "max": 1000, "doc": (
        "random initial partitions of the sets, each refined; the best is kept")})
    seed: int = field(default=0, metadata={"doc": "the partitioner's random numbers"})


@dataclass(frozen=True)
class MonitoringConfig:
    """What control serves to the monitoring stack operators run beside the job
    (``roles.control.monitoring``)."""

    prometheus_port: int = field(default=0, metadata={"min": 0, "max": 65535, "doc": (
        "control serves the cluster's figures for Prometheus at "
        "`http://<prometheus_host>:<port>/metrics`; 0: off")})
    prometheus_host: str = field(default="127.0.0.1", metadata={"doc": (
        "the address the metrics endpoint listens on (`0.0.0.0`: every interface)")})
    tensorboard: bool = field(default=False, metadata={"doc": (
        "write loss, AUC, throughput and the aggregation decisions as TensorBoard events "
        "into `runs/<run>/tensorboard/` (needs the `tensorboard` package: "
        "`pip install 'zbus[tensorboard]'`)")})


@dataclass(frozen=True)
class MetricsConfig:
    """The eval figures beyond AUC, log loss, NE and calibration (``roles.algorithms.shared.
    metrics``)."""

    group_by: str = field(default="", metadata={"doc": (
        "a sparse field (a user id, say): each task's GAUC over the eval rows, the AUC of "
        "each of its values weighted by its rows, values with one class skipped; empty: no "
        "GAUC")})
    group_rows: int = field(default=2_000_000, metadata={"min": 1000, "doc": (
        "eval rows a feeder holds for the GAUC at most: beyond it, the GAUC is that of a "
        "random half of the groups (then a quarter, ...; every feeder keeps the same groups, "
        "exact within them), and the summary says which share")})


@dataclass(frozen=True)
class ServingConfig:
    """What the training roles publish for serving processes that follow the job
    (``zbus-serve --follow``: ``roles.protocol.serving``, docs/serving.md)."""

    publish_ms: int = field(default=200, metadata={"min": 0, "max": 60_000, "doc": (
        "every this many milliseconds control cuts a serving version: "
        "each shard publishes the rows changed since the previous cut (with tombstones for "
        "keys expired, evicted or moved) and the aggregator its dense weights when they "
        "changed; a following `zbus-serve` serves each cut once all its parts are in. 0: "
        "nothing is published (servers follow the checkpoints only; cuts every 200 ms cost "
        "a job up to a few per cent of its samples/s, docs/serving.md)")})
    row_bytes: int = field(default=4, metadata={"choices": (4, 1), "doc": (
        "bytes a value of a published row: 4, float32 as trained; 1, int8 with a float32 "
        "scale a row (its largest magnitude over 127): a row of width 16 is 20 bytes in "
        "place of 64, served within half a scale of each trained value (checkpoints stay "
        "float32; docs/serving.md)")})


@dataclass(frozen=True)
class Job:
    name: str = field(default="job", metadata={"doc": (
        "names the run directory (letters, digits, `-`, `_` or `.`)")})
    data: DataConfig = field(default_factory=DataConfig, metadata={"doc": (
        "the data: where it is, its columns, the eval split, sample weights")})
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"doc": (
        "the network: embeddings and an MLP")})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"doc": (
        "training: epochs, batches, dense synchronisation, learning rates, timeouts")})
    embeddings: EmbeddingsConfig = field(default_factory=EmbeddingsConfig, metadata={"doc": (
        "keeping the shards' embedding tables bounded: admission, expiry, a cap")})
    aggregation: AggregationConfig = field(default_factory=AggregationConfig, metadata={"doc": (
        "when sync mode `lazy` combines the workers' dense weights, and when the aggregator "
        "backs them up; every key is live: changeable while the job runs (`zbus-ctl set`, "
        "the console)")})
    cluster: ClusterConfig = field(default_factory=ClusterConfig, metadata={"doc": (
        "the processes, their endpoints, timing and security")})
    placement: PlacementConfig = field(default_factory=PlacementConfig, metadata={"doc": (
        "where embedding keys live")})
    partition: PartitionConfig = field(default_factory=PartitionConfig, metadata={"doc": (
        "how the network is split over a model-parallel group (`roles/model/partitioner.py`)")})
    stream: StreamConfig = field(default_factory=StreamConfig, metadata={"doc": (
        "learning from a broker's topic (NATS JetStream, Kafka) instead of `[data] path`: no "
        "epochs, each event scored before it is trained (docs/streams.md)")})
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig, metadata={"doc": (
        "whole-job checkpoints and exports: where, how often, how many kept")})
    monitoring: MonitoringConfig = field(default_factory=MonitoringConfig, metadata={"doc": (
        "Prometheus metrics and TensorBoard events")})
    metrics: MetricsConfig = field(default_factory=MetricsConfig, metadata={"doc": (
        "the eval figures beyond AUC and log loss: GAUC")})
    serving: ServingConfig = field(default_factory=ServingConfig, metadata={"doc": (
        "live parameters for serving processes that follow the job (`zbus-serve --follow`)")})
    origin: str = field(default="", metadata={"internal": True})  # where the job was read

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ValueError("name must be non-empty letters, digits, '-', '_' or '.'")
        if self.data.source == "file" and not self.data.path and not self.streaming:
            raise ValueError("[data] path is required when source = \"file\" (or a [stream] "
                             "url)")
        if self.streaming:
            self.check_stream()
        refusal = cluster_refusal(self.train.sync, self.cluster)
        if refusal:
            raise ValueError(refusal)
        if self.train.precision != "fp32" and self.cluster.parts > 1:
            raise ValueError(f"[train] precision = \"{self.train.precision}\" is not supported "
                             f"with model parallelism ([cluster] parts = "
                             f"{self.cluster.parts}): use \"fp32\"")
        self.check_tasks()
        try:
            self.layout()
        except LayoutError as exc:
            raise ValueError(str(exc)) from None
        caps = self.placement.capacities
        if caps and len(caps) != self.cluster.shards:
            raise ValueError(f"[placement] capacities lists {len(caps)} figure(s) for "
                             f"{self.cluster.shards} shard(s)")
        if self.cluster.node_host and self.checkpoint.exports_to_run_dir():
            raise ValueError(
                "[cluster] node_host puts every node on a host of its own: an export into the "
                "run directory would leave each part on its node's disk; set [checkpoint] "
                "export_dir or dir to an s3:// prefix (or export_dir to a directory every node "
                "shares), or export = false")

    @property
    def tasks(self) -> list[str]:
        """The labels, one per task: the network returns one logit per row for one, ``[rows,
        tasks]`` for several (docs/models.md)."""
        if self.data.source == "file":
            return self.data.tasks
        return list(CHAIN) if self.data.synthetic.conversion else ["label"]

    def check_tasks(self) -> None:
        if self.streaming and (self.data.weight or self.data.negative_rate < 1.0):
            raise ValueError("[data] weight and negative_rate are for jobs that read files "
                             "(docs/limits.md)")
        if self.data.source != "file" and (self.data.weight or self.data.negative_rate < 1.0):
            raise ValueError("[data] weight and negative_rate read the rows of files ([data] "
                             "source = \"file\")")
        group_by = self.metrics.group_by
        if group_by and group_by not in self.sparse_fields:
            raise ValueError(f"[metrics] group_by = {group_by!r} is not a sparse field "
                             f"({', '.join(self.sparse_fields)})")
        if group_by and group_by in self.list_fields:
            raise ValueError(f"[metrics] group_by = {group_by!r} is a list field: a row's "
                             "group is one value")
        if self.data.labels and self.data.source != "file":
            raise ValueError("[data] labels name the label columns of files ([data] source = "
                             "\"file\"); the generator's two labels: [data.synthetic] "
                             "conversion = true")
        tasks = self.tasks
        if group_by:   # every feeder's rows for the GAUC travel in its one EvalReport
            report = self.metrics.group_rows * (8 + 8 * len(tasks)) + (1 << 20) * len(tasks)
            if report > self.cluster.max_message_bytes:
                raise ValueError(f"[metrics] group_rows = {self.metrics.group_rows} makes an "
                                 f"eval report of about {report >> 20} MB, more than [cluster] "
                                 f"max_message_mb = {self.cluster.max_message_mb:g}: lower it "
                                 "or raise max_message_mb")
        unknown = sorted(set(self.model.tasks) - set(tasks))
        if unknown:
            raise ValueError(f"[model.tasks] {unknown[0]} is not a label of [data] labels "
                             f"({', '.join(tasks)})")
        for name, weight in self.model.tasks.items():
            if not 0.0 < weight < float("inf"):
                raise ValueError(f"[model.tasks] {name} must be a weight > 0, got {weight}")
        if len(tasks) == 1:   # (a label named twice: DataConfig's "used twice")
            return
        if self.streaming and self.stream.labels.topic:
            raise ValueError("[data] labels: labels on a topic of their own ([stream.labels]) "
                             "are joined one label a row (docs/limits.md)")
        if self.train.batch_by_label:
            raise ValueError("[train] batch_by_label sorts batches by one label: not with "
                             "several ([data] labels)")
        if self.data.negative_rate < 1.0:
            raise ValueError("[data] negative_rate corrects one label's probabilities: with "
                             "several labels the others would stay biased (docs/limits.md)")
        if self.cluster.parts > 1:
            raise ValueError("[data] labels: model-parallel groups ([cluster] parts > 1) train "
                             "one label (docs/limits.md)")

    def task_weights(self) -> list[float]:
        """Each task's loss weight, in ``tasks`` order."""
        return [float(self.model.tasks.get(t, 1.0)) for t in self.tasks]

    @property
    def streaming(self) -> bool:
        """A stream job: it learns from ``[stream]``'s topic, not from passes over files."""
        return bool(self.stream.url)

    def check_stream(self) -> None:
        d = self.data
        if d.source != "file" or d.path or d.eval_path:
            raise ValueError("[stream] url replaces [data] path: give one or the other (a "
                             "stream job reads its rows from the topic; [data] says their "
                             "columns)")
        if d.format not in ("csv", "tsv"):
            raise ValueError(f"[data] format = \"{d.format}\" is a file's; a stream's events "
                             "are [stream] format (json, tsv or csv)")
        if d.merge:
            raise ValueError("[data] merge is not for stream jobs: an event is trained as it "
                             "comes")
        if d.decay_base > 1.0 and not d.timestamp:
            raise ValueError("[data] decay_base > 1 needs a timestamp column ([data] timestamp)")
        if self.train.epochs != 1 and self.train.epochs != TrainConfig.epochs:
            raise ValueError("[train] epochs: a stream job has none; it ends at [train] "
                             "until_events or until_s, or when stopped")
        if self.cluster.parts > 1:
            raise ValueError("[cluster] parts > 1: a stream job does not run model-parallel "
                             "groups yet (docs/limits.md)")
        if self.stream.labels.topic and self.cluster.feeders > 1:
            raise ValueError("[stream.labels] topic: labels on a topic of their own are joined "
                             "by one feeder ([cluster] feeders = 1; docs/limits.md): a label "
                             "and its impression must reach the same feeder")

    @property
    def sparse_fields(self) -> list[str]:
        if self.data.source == "synthetic":
            more = list(SYNTHETIC_ITEM_FIELDS) if self.data.synthetic.items else []
            return [f"c{i}" for i in range(len(self.data.synthetic.vocab))] + more
        if self.data.format == "criteo" and not self.data.sparse:
            return [f"C{i}" for i in range(1, 27)]
        return list(self.data.sparse)

    @property
    def dense_fields(self) -> list[str]:
        if self.data.source == "synthetic":
            return [f"d{i}" for i in range(self.data.synthetic.dense)]
        if self.data.format == "criteo" and not self.data.dense:
            return [f"I{i}" for i in range(1, 14)]
        return list(self.data.dense)

    @property
    def list_fields(self) -> dict[str, str]:
        """Each list field and its separator (the synthetic items' own, then the job's)."""
        implied = {"genres": "|", "history": "|"} if self.data.source == "synthetic" \
            and self.data.synthetic.items else {}
        return {**implied, **self.data.lists}

    @property
    def tables(self) -> dict[str, list[str]]:
        """Shared tables: name -> fields (the synthetic items' ``item`` table, then the
        job's)."""
        implied = {"item": ["item", "history"]} if self.data.source == "synthetic" \
            and self.data.synthetic.items and not self.data.tables else {}
        return {**implied, **self.data.tables}

    def layout(self) -> FieldLayout:
        """The sparse fields as every role sees them (``roles.job.fields``)."""
        s = self.data.synthetic
        implied = {"genres": 3, "history": s.history} if self.data.source == "synthetic" \
            and s.items else {}   # the synthetic lists' longest: no slot always empty
        m = self.model
        per_id = len(self.tasks) if self.has_weights_per_id else 0
        crosses = m.options.get("crosses", []) if self.layout_crosses else []
        if not isinstance(crosses, list):
            raise LayoutError(f"[model.options] crosses must be a list of lists of sparse "
                              f"fields, got {crosses!r}")
        return FieldLayout.of(self.sparse_fields, self.list_fields, self.tables,
                              m.embedding_dim, m.dims, m.pooling,
                              {**implied, **m.max_len}, per_id=per_id, crosses=crosses)

    @property
    def has_weights_per_id(self) -> bool:
        """The layout has a weight per id of every field (``[model] weights_per_id``, or a
        built-in that always has them)."""
        m = self.model
        return m.weights_per_id or (not m.module and m.network in PER_ID_NETWORKS)

    @property
    def layout_crosses(self) -> bool:
        """``[model.options] crosses`` make the layout's ``cross:`` fields: for any network
        with weights per id but deepfm (a first order of ids only: its build refuses the
        option)."""
        return self.has_weights_per_id and (bool(self.model.module)
                                            or self.model.network != "deepfm")

    def fingerprint(self) -> str:
        """Same for every node that runs the same job; control refuses a node that differs."""
        body = {k: v for k, v in dataclasses.asdict(self).items() if k != "origin"}
        where = module_path(self)
        if where is not None:   # the network's code, too: every node must run the same,
            # wherever its file is (a node may load control's copy: roles.job.network_file)
            body["model"]["module"] = ":" + self.model.module.rpartition(":")[2]
            try:
                body["module_sha256"] = hashlib.sha256(where.read_bytes()).hexdigest()
            except OSError:
                body["module_sha256"] = "unreadable"
        return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


# -- building from TOML ------------------------------------------------------------------------

def _where(path: tuple[str, ...]) -> str:
    if len(path) == 1:
        return path[0]
    return f"[{'.'.join(path[:-1])}] {path[-1]}"


def _kind(t: Any) -> str:
    origin = typing.get_origin(t) or t
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            list: "a list", dict: "a table"}.get(origin, "a table")


def _coerce(value: Any, t: Any, path: tuple[str, ...], meta: typing.Mapping) -> Any:
    if t is Any:   # [model.options]: what TOML holds but tables (lists of lists: crosses)
        def plain(v: Any, depth: int) -> bool:
            return not isinstance(v, dict) and (not isinstance(v, list) or depth < 2 and all(
                plain(x, depth + 1) for x in v))
        if not plain(value, 0):
            raise JobError(f"{_where(path)} must be a number, string, boolean or a list of "
                           f"them (or of lists of them), got {value!r}")
        return value
    origin = typing.get_origin(t) or t
    if isinstance(origin, type) and dataclasses.is_dataclass(origin):
        if not isinstance(value, dict):
            raise JobError(f"[{'.'.join(path)}] must be a table")
        return _build(origin, value, path)
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
        list: lambda v: isinstance(v, list),
        dict: lambda v: isinstance(v, dict),
    }[origin](value)
    if not ok:
        raise JobError(f"{_where(path)} must be {_kind(t)}, got {value!r}")
    if origin is list:
        (item,) = typing.get_args(t)
        return [_coerce(v, item, path, {}) for v in value]
    if origin is dict:
        _, item = typing.get_args(t)
        return {str(k): _coerce(v, item, (*path, str(k)), {}) for k, v in value.items()}
    if origin is float:
        value = float(value)
    if "choices" in meta and value not in meta["choices"]:
        raise JobError(f"{_where(path)} must be one of {', '.join(map(repr, meta['choices']))}"
                       f", got {value!r}")
    if "min" in meta and value < meta["min"]:
        raise JobError(f"{_where(path)} must be >= {meta['min']}, got {value!r}")
    if "max" in meta and value > meta["max"]:
        raise JobError(f"{_where(path)} must be <= {meta['max']}, got {value!r}")
    return value


def _settable(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}


MOVED = {("train", "checkpoint_s"): "[checkpoint] every_s (whole-job checkpoints)"}


def _build(cls: type, table: dict, path: tuple[str, ...] = ()) -> Any:
    hints = typing.get_type_hints(cls)
    known = _settable(cls)
    values = {}
    for key, value in table.items():
        if (*path, key) in MOVED:
            raise JobError(f"{_where((*path, key))} is now {MOVED[(*path, key)]}")
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise JobError(f"unknown key {_where((*path, key))}{hint}")
        values[key] = _coerce(value, hints[key], (*path, key), known[key].metadata)
    try:
        return cls(**values)
    except ValueError as exc:
        raise JobError(str(exc)) from None


def _env_value(raw: str, t: Any) -> Any:
    """A ``ZBUS_*`` variable's text as its key reads it: a string key takes the text as it is
    (``2024-01-01.csv``, ``123``); any other key, as a TOML value (``3``, ``[64, 32]``,
    ``true``), or the text when it is not one (the key's check then says what was wanted)."""
    if t is not Any and (typing.get_origin(t) or t) is str:
        return raw
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


# the settings that name a file or a directory: relative to the job file (from the
# environment: to the working directory); an object store's URI is kept as it is
LOCATIONS = ((DataConfig, "path"), (DataConfig, "eval_path"), (CheckpointConfig, "dir"),
             (CheckpointConfig, "export_dir"))
_section_of = {DataConfig: "data", CheckpointConfig: "checkpoint"}


def located(value: str, base: Path) -> str:
    """A setting's file or directory: a URI (``s3://...``) as it is, a local path made
    absolute against ``base``."""
    from roles.storage.fs import is_uri  # here: it imports pyarrow's filesystems
    if is_uri(value):
        return value
    return os.path.normpath(base / Path(value).expanduser())


def _env_overrides(table: dict, environ: typing.Mapping[str, str]) -> None:
    for var, raw in sorted(environ.items()):
        if not var.startswith("ZBUS_") or var in RESERVED_ENV or "__" not in var:
            continue
        keys = [k.lower() for k in var[len("ZBUS_"):].split("__")]
        cls: Any = Job
        node = table
        for depth, key in enumerate(keys):
            known = _settable(cls)
            if key not in known:
                raise JobError(f"environment variable {var} names no job key "
                               f"({_where(tuple(keys[:depth + 1]))} is unknown)")
            hint = typing.get_type_hints(cls)[key]
            if depth == len(keys) - 1:
                value = _env_value(raw, hint)
                if (cls, key) in LOCATIONS and isinstance(value, str) and value:
                    value = located(value, Path.cwd())
                if key == "module" and cls is ModelConfig and isinstance(value, str):
                    value = module_at(value, Path.cwd())
                try:  # checked here, so that a bad value names the variable it came from
                    _coerce(value, hint, tuple(keys), known[key].metadata)
                except JobError as exc:
                    raise JobError(f"{exc} (from the environment variable {var})") from None
                node[key] = value
            else:
                cls = hint
                if not dataclasses.is_dataclass(cls):
                    raise JobError(f"environment variable {var}: {key} is not a section")
                node = node.setdefault(key, {})


def _stream_defaults(table: dict) -> None:
    """A stream job's own defaults, where its file and the environment leave them: dense
    synchronisation ``step`` and embeddings ``pull`` (test-then-train as one process does it,
    each batch read after every earlier batch's update: docs/streams.md)."""
    stream, train = table.get("stream"), table.get("train")
    if not isinstance(stream, dict) or not stream.get("url"):
        return
    if train is None:
        train = table["train"] = {}
    if isinstance(train, dict):
        train.setdefault("sync", "step")
        train.setdefault("embeddings", "pull")


def parse_job(text: str, origin: str = "<job>", base_dir: Path | None = None,
              environ: typing.Mapping[str, str] | None = None) -> Job:
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise JobError(f"not valid TOML: {exc}") from None
    for cls, key in LOCATIONS:
        section = table.get(_section_of[cls])
        if isinstance(section, dict) and isinstance(section.get(key), str) and section[key] \
                and base_dir is not None:
            section[key] = located(section[key], base_dir)
    model = table.get("model")
    if isinstance(model, dict) and isinstance(model.get("module"), str) \
            and base_dir is not None:
        model["module"] = module_at(model["module"], base_dir)
    _env_overrides(table, os.environ if environ is None else environ)
    _stream_defaults(table)
    job = _build(Job, table)
    return dataclasses.replace(job, origin=origin)


def read_cluster_file(path: str) -> dict[str, str]:
    """A cluster file's endpoints: ``[endpoints]`` name = "host:port" (TCP) or a full
    ``tcp://`` / ``ipc://`` address, for every role's endpoint on every host."""
    try:
        table = tomllib.loads(Path(path).expanduser().read_text())
    except OSError as exc:
        raise JobError(f"cannot read cluster file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise JobError(f"cluster file {path} is not valid TOML: {exc}") from None
    endpoints = table.get("endpoints")
    if set(table) - {"endpoints"} or not isinstance(endpoints, dict) or not all(
            isinstance(v, str) and v for v in endpoints.values()):
        raise JobError(f"cluster file {path} must hold one [endpoints] table of "
                       "name = \"host:port\" entries")
    return {name: v if "://" in v else f"tcp://{v}" for name, v in endpoints.items()}


def load_job(path: str | None = None, environ: typing.Mapping[str, str] | None = None) -> Job:
    """The job from ``path``, else ``ZBUS_JOB``, else the built-in default job; with
    ``ZBUS_CLUSTER_FILE``, its endpoints (``read_cluster_file``) replace the job's."""
    env = os.environ if environ is None else environ
    if env.get("ZBUS_CLUSTER_FILE"):
        endpoints = read_cluster_file(env["ZBUS_CLUSTER_FILE"])
        inline = ", ".join(f"{orjson.dumps(n).decode()} = {orjson.dumps(a).decode()}"
                           for n, a in endpoints.items())
        env = {**env, "ZBUS_CLUSTER__ENDPOINTS": "{" + inline + "}"}
    path = path or env.get("ZBUS_JOB") or None
    if path is None:
        text = resources.files("roles.job").joinpath("default_job.toml").read_text()
        return parse_job(text, "built-in default job", None, env)
    file = Path(path).expanduser()
    try:
        text = file.read_text()
    except OSError as exc:
        tried = file.absolute()
        where = f" ({tried})" if str(tried) != path else ""
        raise JobError(f"cannot read job file {path}{where}: {exc.strerror}") from None
    return parse_job(text, str(file), file.absolute().parent, env)


def toml_value(v: Any) -> str:
    """A setting's value as TOML: a boolean, a string, a number or a list of them."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return orjson.dumps(v).decode()
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def job_to_toml(job: Job) -> str:
    """The effective job as TOML (written to the run directory as config.toml)."""
    lines = [f"# effective job, read from {job.origin}"]

    def table(obj: Any, path: list[str]) -> None:
        scalars = {k: getattr(obj, k) for k in _settable(type(obj))}
        subs = {k: v for k, v in scalars.items() if dataclasses.is_dataclass(v)
                or isinstance(v, dict)}
        if path:
            lines.append(f"\n[{'.'.join(path)}]")
        for k, v in scalars.items():
            if k not in subs:
                lines.append(f"{k} = {toml_value(v)}")
        for k, v in subs.items():
            if isinstance(v, dict):
                lines.append(f"\n[{'.'.join([*path, k])}]")
                lines.extend(f"{orjson.dumps(n).decode()} = {toml_value(x)}" for n, x in v.items())
            else:
                table(v, [*path, k])

    table(job, [])
    return "\n".join(lines) + "\n"
