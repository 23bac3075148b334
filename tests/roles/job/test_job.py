from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import REPO

from roles.job.settings import JobError, job_to_toml, load_job, parse_job

SYNTHETIC = "[data]\nsource = 'synthetic'\n"

ADULT = REPO / "jobs" / "adult.toml"


def test_builtin_default_job_is_synthetic():
    job = load_job(environ={})
    assert job.data.source == "synthetic"
    assert job.cluster.workers == 2 and job.cluster.shards == 2
    assert job.sparse_fields == [f"c{i}" for i in range(8)]


def test_zbus_job_names_the_file_and_data_path_is_relative_to_it():
    job = load_job(environ={"ZBUS_JOB": str(ADULT)})
    assert job.name == "adult"
    assert Path(job.data.path) == ADULT.parent.parent / "data" / "adult.csv.gz"


@pytest.mark.parametrize("text,needle", [
    ("[train]\nepoch = 3", "unknown key [train] epoch (did you mean 'epochs'?)"),
    ("[trian]\nepochs = 3", "unknown key trian (did you mean 'train'?)"),
    ("[train]\nepochs = 'three'", "[train] epochs must be an integer, got 'three'"),
    ("[train]\nepochs = 0", "[train] epochs must be >= 1"),
    ("[train]\nsync = 'sometimes'", "[train] sync must be one of 'step', 'every'"),
    ("[model]\nhidden = 64", "[model] hidden must be a list"),
    ("[model]\nhidden = [64, 'x']", "[model] hidden must be an integer, got 'x'"),
    ("[data]\nsource = 'file'\nlabel = 'y'\nsparse = ['a']", "[data] path is required"),
    ("[data.synthetic]\nrows = true", "[data.synthetic] rows must be an integer"),
    ("[cluster.endpoints]\nnope = 'tcp://h:1'", "unknown endpoint 'nope'"),
    ("[cluster.endpoints]\ncontrol = 'h:1'", "must start with one of tcp://"),
    ("name = 'a b'", "name must be"),
    ("[train]\nsync = 'step'\n[cluster]\nparts = 2",
     "[cluster] parts > 1 (model parallelism) needs [train] sync = \"every\", \"round\" or "
     "\"lazy\": in sync mode step the aggregator takes every step's whole gradient from one "
     "process"),
    ("[train]\nsync = 'round'\n[cluster]\nfeeders = 2",
     "[cluster] feeders > 1 needs [train] sync = \"step\", \"every\" or \"lazy\": in sync "
     "mode round one feeder's ledger counts every batch of a round"),
    ("[train]\nprecision = 'fp16'", "[train] precision must be one of 'fp32', 'bf16'"),
    ("[train]\nprecision = 'bf16'\n[cluster]\nparts = 2",
     "[train] precision = \"bf16\" is not supported with model parallelism ([cluster] parts "
     "= 2): use \"fp32\""),
    ("[train\n", "not valid TOML"),
    ("[data]\nsource = 'synthetic'\nlabels = ['a', 'b']",
     "[data] labels name the label columns of files"),
    ("[data]\npath = 'x.csv'\nlabels = ['a', 'b']\nsparse = ['c']\nnegative_rate = 0.1",
     "[data] negative_rate corrects one label's probabilities"),
    ("[data]\npath = 'x.csv'\nlabels = ['a', 'a']\nsparse = ['c']", "used twice"),
    ("[data]\npath = 'x.csv'\nlabel = 'y'\nlabels = ['a', 'b']\nsparse = ['c']",
     "[data] label and labels: name the label columns in one of them"),
    ("[data]\npath = 'x.csv'\nlabels = ['a', 'b']\nsparse = ['c']\n[model.tasks]\nz = 2.0",
     "[model.tasks] z is not a label of [data] labels (a, b)"),
    ("[data]\npath = 'x.csv'\nsparse = ['c']\n[metrics]\ngroup_by = 'u'",
     "[metrics] group_by = 'u' is not a sparse field (c)"),
    ("[data]\npath = 'x.csv'\nsparse = ['c']\n[metrics]\ngroup_by = 'c'\n"
     "group_rows = 20000000", "makes an eval report of about 306 MB, more than [cluster] "
                             "max_message_mb = 256"),
])
def test_mistakes_are_named(text, needle):
    with pytest.raises(JobError) as err:
        parse_job(text if "[data]" in text else text + "\n[data]\nsource = 'synthetic'\n",
                  environ={})
    assert needle in str(err.value)


def test_environment_overrides_any_key():
    env = {"ZBUS_TRAIN__EPOCHS": "1", "ZBUS_MODEL__HIDDEN": "[32, 16]",
           "ZBUS_DATA__SYNTHETIC__ROWS": "500", "ZBUS_CLUSTER__HOST": "10.0.0.7",
           "ZBUS_JOB": "ignored-here", "ZBUS_RUN_DIR": "/tmp/x"}
    job = parse_job(SYNTHETIC, environ=env)
    assert job.train.epochs == 1
    assert job.model.hidden == [32, 16]
    assert job.data.synthetic.rows == 500
    assert job.cluster.host == "10.0.0.7"
    assert job.cluster.endpoint("ps-1") == "tcp://10.0.0.7:47111"


def test_unknown_or_bad_override_is_named():
    with pytest.raises(JobError, match="ZBUS_TRAIN__EPOCH names no job key"):
        parse_job(SYNTHETIC, environ={"ZBUS_TRAIN__EPOCH": "1"})
    with pytest.raises(JobError, match=r"\[train\] epochs must be an integer, got 'many' "
                       r"\(from the environment variable ZBUS_TRAIN__EPOCHS\)"):
        parse_job(SYNTHETIC, environ={"ZBUS_TRAIN__EPOCHS": "many"})


def test_a_string_key_takes_the_variables_text_as_it_is():
    """Text that TOML would read as a date, a number or nothing stays the text a string key
    was given; other keys still read TOML."""
    env = {"ZBUS_DATA__LABEL": "2024-01-01", "ZBUS_DATA__TIMESTAMP": "123",
           "ZBUS_CLUSTER__HOST": "", "ZBUS_TRAIN__EPOCHS": "3"}
    job = parse_job(SYNTHETIC, environ=env)
    assert (job.data.label, job.data.timestamp, job.cluster.host, job.train.epochs) == \
        ("2024-01-01", "123", "", 3)


@pytest.mark.parametrize("text, pair", [
    ("data__path=2024-data.csv", ("data__path", "2024-data.csv")),
    ("data__path=", ("data__path", "")),
    ("train__epochs=-3", ("train__epochs", "-3")),
    ("model__hidden=[8, 4]", ("model__hidden", "[8, 4]")),
])
def test_the_scripts_set_option_keeps_the_text_for_the_job_schema(text, pair):
    """``--set`` of the benchmarks and the soak (``setting_pair``): the text goes to the job
    schema as a ZBUS_* variable, which types and checks it."""
    from roles.testbed.local_cluster import setting_pair

    assert setting_pair(text) == pair
    with pytest.raises(ValueError, match="SECTION__KEY=VALUE"):
        setting_pair("train__epochs")


def test_override_of_data_path_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = parse_job(ADULT.read_text(), base_dir=ADULT.parent,
                    environ={"ZBUS_DATA__PATH": "mine.csv"})
    assert job.data.path == str(tmp_path / "mine.csv")


def test_missing_job_file_is_a_job_error(tmp_path):
    with pytest.raises(JobError, match="cannot read job file"):
        load_job(str(tmp_path / "none.toml"), environ={})


def test_fingerprint_tells_jobs_apart():
    a = parse_job(SYNTHETIC, environ={})
    assert a.fingerprint() == parse_job(SYNTHETIC, environ={}).fingerprint()
    other = parse_job(SYNTHETIC, environ={"ZBUS_TRAIN__EPOCHS": "9"})
    assert a.fingerprint() != other.fingerprint()


def test_effective_config_reads_back_as_the_same_job():
    job = load_job(str(ADULT), environ={"ZBUS_CLUSTER__ENDPOINTS": '{control = "ipc:///t/c"}'})
    again = parse_job(job_to_toml(job), environ={})
    assert dataclasses.replace(again, origin=job.origin) == job


@pytest.mark.integration
@pytest.mark.parametrize(("given", "threads"), [(None, 1), ("2", 2)])
def test_a_role_process_runs_numpys_blas_on_one_thread_unless_the_user_says(given, threads):
    """OpenBLAS's pool spins between calls: a role calling it now and then kept a core busy
    (``roles/__init__.py``). Its threads are started when numpy loads, so they are counted in
    /proc after importing a role."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    code = ("import os, roles.aggregator, numpy; numpy.linalg.norm(numpy.ones(1 << 20)); "
            "main = open('/proc/self/comm').read(); "   # python, python3, ...: as it is started
            "print(sum(open(f'/proc/self/task/{t}/comm').read() == main"
            " for t in os.listdir('/proc/self/task')))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert int(out.stdout) == threads, out


def test_auto_threads_leave_cores_to_the_other_roles_on_one_host():
    from roles.model.network import auto_threads
    one_host = parse_job(SYNTHETIC + "[cluster]\nworkers = 2\nshards = 2\n", environ={})
    assert one_host.cluster.single_host()
    assert auto_threads(one_host.cluster, 2) == 1
    assert auto_threads(one_host.cluster, 16) == 6   # (16 - feeder - 2 shards) // 2
    spread = parse_job(SYNTHETIC + "[cluster.endpoints]\n\"ps-1\" = \"tcp://10.0.0.3:1\"\n",
                       environ={})
    assert not spread.cluster.single_host()
    assert auto_threads(spread.cluster, 16) == 16      # nothing busy bound on this host
    # across hosts, a core left to each feeder and shard bound on the worker's own host
    hosts = parse_job(SYNTHETIC + "[cluster]\nshards = 2\n[cluster.endpoints]\n"
                      "\"samples\" = \"tcp://10.0.0.2:1\"\n\"ps-0\" = \"tcp://10.0.0.2:2\"\n"
                      "\"ps-1\" = \"tcp://10.0.0.3:3\"\n", environ={})
    assert auto_threads(hosts.cluster, 2, {"10.0.0.3"}) == 1     # ps-1 beside it
    assert auto_threads(hosts.cluster, 16, {"10.0.0.2"}) == 14   # the feeder and ps-0
    assert auto_threads(hosts.cluster, 16, {"10.0.0.9"}) == 16
    assert auto_threads(hosts.cluster, 1, {"10.0.0.2"}) == 1


def test_a_job_whose_nodes_have_hosts_of_their_own_exports_to_one_place_or_not_at_all():
    """[cluster] node_host (every pod a host of its own): an export into the run directory
    would leave each part on its own pod's disk, so the job is refused with one line unless
    the export goes to one place (an object store, or a directory named as shared) or is
    switched off."""
    def parse(checkpoint: str):
        text = f'[data]\nsource = "synthetic"\n[cluster]\nnode_host = "zbus-{{node}}.zbus"\n' \
               f"[checkpoint]\n{checkpoint}\n"
        return parse_job(text, "job.toml", Path("/etc/zbus"), environ={})

    with pytest.raises(JobError, match="node_host .* export_dir or dir to an s3:// prefix"):
        parse("")
    with pytest.raises(JobError, match="node_host"):
        parse('dir = "/var/lib/zbus/checkpoints"')   # a pod's own disk too
    assert parse('dir = "s3://b/c"').checkpoint.export_root("/run") == "s3://b/c"
    assert parse('export_dir = "s3://b/e"').checkpoint.export_root("/run") == "s3://b/e"
    assert parse('export_dir = "/mnt/shared"').checkpoint.export_root("/run") == "/mnt/shared"
    assert parse("export = false").checkpoint.export is False
    # without node_host (one host, or hosts of a cluster file) the run directory is as before
    job = parse_job('[data]\nsource = "synthetic"\n', "job.toml", None, environ={})
    assert job.checkpoint.export_root("/run") == "/run"
