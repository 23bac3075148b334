"""The Kubernetes manifests (deploy/kubernetes) and the container image (Dockerfile) hold
together: every rendered object of base/ and of every overlay is valid for the two newest
Kubernetes versions that kubernetes-validate knows (its OpenAPI schemas, offline, strict: no
unknown field); the pods share one template (components/zbus-pod) and differ only where their
roles do; the counts have one source (the replicas) and reach the job through the pods'
environment; the job each kustomization ships parses, and exports to one place or not at all;
the zbus-wait Job's exit statuses are the waiter's. And the image's compiled loops are what a
pod runs: its numba cache, built as the Dockerfile builds it, is read by a role started as a
pod starts it (read-only tree, the init container's copy), with nothing compiled. Nothing here
needs a cluster or a container engine: ``kubectl kustomize`` renders offline, and the image is
read from its Dockerfile."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import typing
from pathlib import Path

import pytest
from harness import REPO

from roles.job.settings import Job, parse_job
from roles.protocol.topology import reserved_ports
from roles.tools import wait

ROOT = REPO   # the checkout
KUBE = ROOT / "deploy" / "kubernetes"
TARGETS = ["base", *sorted(f"overlays/{p.parent.name}"
                           for p in (KUBE / "overlays").glob("*/kustomization.yaml"))]
SERVICE = "zbus"
ROLES = ("control", "feeder", "ps", "aggregator", "worker")
# the StatefulSet whose replicas are each [cluster] count (control: always one)
COUNT_KEY = {"feeder": "feeders", "ps": "shards", "aggregator": "aggregators",
             "worker": "workers"}
UID = 10001


@functools.cache
def kustomize(target: str) -> str:
    """``kubectl kustomize`` of ``deploy/kubernetes/<target>`` (offline), once per session."""
    return subprocess.run(["kubectl", "kustomize", str(KUBE / target)], check=True,
                          capture_output=True, text=True, timeout=60).stdout


def render(target: str | Path) -> list[dict]:
    import yaml
    if shutil.which("kubectl") is None:
        pytest.skip("no kubectl to render the kustomization with")
    if isinstance(target, Path):   # a kustomization of a test's own
        text = subprocess.run(["kubectl", "kustomize", str(target)], check=True,
                              capture_output=True, text=True, timeout=60).stdout
    else:
        text = kustomize(target)
    return copy.deepcopy([doc for doc in yaml.safe_load_all(text) if doc])


@pytest.fixture(scope="module")
def base() -> list[dict]:
    return render("base")


def newest_versions(n: int = 2) -> list[str]:
    """The ``n`` newest Kubernetes minor versions whose schemas kubernetes-validate ships."""
    from kubernetes_validate import utils
    minors = {utils.major_minor(v): v for v in utils.all_versions()}
    return [minors[m] for m in sorted(minors, key=lambda m: tuple(map(int, m.split("."))))[-n:]]


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def workloads(objects: list[dict]) -> dict[str, dict]:
    """The StatefulSets and the Job: every object with a pod template."""
    return {**by_kind(objects, "StatefulSet"), **by_kind(objects, "Job")}


def only_container(obj: dict) -> dict:
    containers = obj["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{obj['metadata']['name']}: one container per pod"
    return containers[0]


def env_of(container: dict) -> dict[str, str]:
    """The container's plain variables (not those from fields or Secrets)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def job_configmap(objects: list[dict]) -> dict:
    maps = [o for name, o in by_kind(objects, "ConfigMap").items()
            if name.startswith("zbus-job")]
    assert len(maps) == 1
    return maps[0]


def job_of(objects: list[dict], workload: str = "zbus-control") -> Job:
    """The job a pod reads: the ConfigMap's job.toml under the pod's environment."""
    text = job_configmap(objects)["data"]["job.toml"]
    environ = env_of(only_container(workloads(objects)[workload]))
    return parse_job(text, "job.toml", Path("/etc/zbus"), environ=environ)


def job_table(objects: list[dict]) -> dict:
    return tomllib.loads(job_configmap(objects)["data"]["job.toml"])


# ---- every object valid for the two newest Kubernetes versions -------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_object_is_valid_for_the_two_newest_kubernetes_versions(target):
    import kubernetes_validate
    objects = render(target)
    versions = newest_versions()
    assert len(versions) == 2
    kinds = {o["kind"] for o in objects}
    assert kinds == {"ConfigMap", "Service", "StatefulSet", "Job"}, "built-in kinds only"
    for version in versions:
        for obj in objects:
            # raises ValidationError (a bad or unknown field, strict) or SchemaNotFoundError
            kubernetes_validate.validate(obj, version, strict=True)
    # the validator does catch a mistake (so that the loop above is not vacuous)
    broken = dict(by_kind(objects, "Service")["zbus"])
    broken["spec"] = {**broken["spec"], "clusterIp": "None"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, versions[-1], strict=True)


@pytest.mark.integration
@pytest.mark.parametrize("target", TARGETS)
def test_nothing_is_left_unreplaced_and_no_namespace_is_forced_but_by_an_overlay(target):
    objects = render(target)
    text = json.dumps(objects)
    assert "deploy/kubernetes/counts" not in text, "a count the transformer did not set"
    assert "every-zbus" not in text, "a patch's placeholder name"
    namespaces = {o["metadata"].get("namespace") for o in objects}
    if target == "base" or target == "overlays/gpu":
        assert namespaces == {None}, "base/ leaves the namespace to kubectl -n"
    else:
        assert len(namespaces) == 1 and None not in namespaces


# ---- the pods are the job's nodes -----------------------------------------------------------

@pytest.mark.integration
def test_every_statefulset_names_its_pods_through_the_headless_service(base):
    services = by_kind(base, "Service")
    assert list(services) == [SERVICE]
    spec = services[SERVICE]["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    sets = by_kind(base, "StatefulSet")
    assert sorted(sets) == sorted(f"zbus-{r}" for r in ROLES)
    for name, sts in sets.items():
        assert sts["spec"]["serviceName"] == SERVICE, name
        assert sts["spec"]["podManagementPolicy"] == "Parallel", name
        assert sts["spec"]["updateStrategy"]["type"] == "OnDelete", name
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in spec["selector"].items()), \
            f"{name}: its pods are not behind the Service"
        assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert labels["app.kubernetes.io/component"] == name.removeprefix("zbus-")
    # the waiter's pod is no node: not behind the Service
    labels = by_kind(base, "Job")["zbus-wait"]["spec"]["template"]["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in spec["selector"].items())


@pytest.mark.integration
def test_the_service_lists_no_ports_so_that_none_is_kept_in_step_with_the_job(base):
    """A headless Service names its pods whatever ports they use: the job's endpoints (any
    count of shards, feeders, aggregators) need nothing from it but the names."""
    spec = by_kind(base, "Service")[SERVICE]["spec"]
    assert "ports" not in spec and spec["clusterIP"] == "None"
    job = job_of(base)
    for name in job.cluster.endpoint_names():
        host = job.cluster.endpoint(name).split("://")[1].rsplit(":", 1)[0]
        assert host.endswith(f".{SERVICE}"), name


@pytest.mark.integration
@pytest.mark.parametrize("target", TARGETS)
def test_each_container_runs_zbus_pod_with_its_statefulsets_role(target):
    for name, sts in by_kind(render(target), "StatefulSet").items():
        container = only_container(sts)
        assert container["name"] == "zbus"
        assert container["command"] == ["zbus-pod", name.removeprefix("zbus-")]
        assert "args" not in container
        env = {e["name"]: e for e in container["env"]}
        assert env["ZBUS_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["ZBUS_BIND_INTERFACE"]["value"] == "*"
        assert env["ZBUS_JOB"]["value"] == "/etc/zbus/job.toml"
        assert env["ZBUS_RUN_DIR"]["value"] == "/var/lib/zbus/run"
        assert {"secretRef": {"name": "zbus-s3", "optional": True}} in container["envFrom"]


@pytest.mark.integration
@pytest.mark.parametrize("target", TARGETS)
def test_pod_names_are_the_jobs_node_ids_and_the_counts_are_the_replicas(target):
    """One source for the counts: each StatefulSet's replicas, which every pod (and the
    waiter) gets as ZBUS_CLUSTER__*, which the job reads."""
    objects = render(target)
    sets = by_kind(objects, "StatefulSet")
    assert sets["zbus-control"]["spec"]["replicas"] == 1
    for workload in workloads(objects):
        cluster = job_of(objects, workload).cluster
        for role, key in COUNT_KEY.items():
            assert sets[f"zbus-{role}"]["spec"]["replicas"] == getattr(cluster, key), \
                f"{workload}: zbus-{role} replicas != [cluster] {key}"
    cluster = job_of(objects).cluster
    assert not {"feeders", "shards", "aggregators", "workers"} & \
        job_table(objects)["cluster"].keys(), "job.toml sets a count: the replicas do"
    pods = {f"{name}-{i}" for name, sts in sets.items() for i in range(sts["spec"]["replicas"])}
    nodes = ["control-0", *cluster.expected_nodes()]
    # node ps-3 binds at zbus-ps-3.zbus: pod zbus-ps-3 of the Service zbus
    assert {cluster.node_host.format(node=n) for n in nodes} == {f"{p}.{SERVICE}" for p in pods}
    owners = {cluster.endpoint_owner(e) for e in cluster.endpoint_names()}
    assert {f"zbus-{o}" for o in owners} <= pods


@pytest.mark.integration
def test_an_overlay_changes_a_count_in_one_place(tmp_path):
    """replicas: in an overlay, with the counts transformer after it: the StatefulSet and
    every pod's job follow; without the transformer the job would keep base's count (why
    every kustomization that sets replicas: lists it)."""
    def overlay(name: str, transformers: bool) -> Path:
        where = tmp_path / name
        where.mkdir()
        rel = os.path.relpath(KUBE, where)
        (where / "kustomization.yaml").write_text(
            f"resources: [{rel}/base]\nreplicas:\n  - {{name: zbus-ps, count: 5}}\n"
            + (f"transformers: [{rel}/counts]\n" if transformers else ""))
        return where

    objects = render(overlay("with", True))
    assert by_kind(objects, "StatefulSet")["zbus-ps"]["spec"]["replicas"] == 5
    assert {job_of(objects, w).cluster.shards for w in workloads(objects)} == {5}
    stale = render(overlay("without", False))
    assert job_of(stale).cluster.shards == 2


# ---- the job file in the ConfigMap ---------------------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("target", TARGETS)
def test_the_configmap_holds_the_job_mounted_where_zbus_job_says(target):
    objects = render(target)
    shipped = KUBE / target / "job.toml"
    text = job_configmap(objects)["data"]["job.toml"]
    assert text == (shipped if shipped.exists() else KUBE / "base" / "job.toml").read_text()
    keys_dir = job_of(objects).cluster.keys_dir
    for workload in workloads(objects).values():
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in only_container(workload)["volumeMounts"]}
        job = mounts["/etc/zbus/job.toml"]
        assert volumes[job["name"]]["configMap"]["name"] == \
            job_configmap(objects)["metadata"]["name"]
        assert job["subPath"] == "job.toml"
        keys = volumes[mounts[keys_dir]["name"]]["secret"]
        assert keys["secretName"] == "zbus-keys"
        assert keys["optional"] is True, "a job with CURVE off needs no Secret"
        assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
        if workload["kind"] == "StatefulSet":
            assert "emptyDir" in volumes[mounts["/var/lib/zbus"]["name"]]


@pytest.mark.integration
@pytest.mark.parametrize("target", TARGETS)
def test_every_role_pod_reserves_the_ports_its_job_binds(target):
    """The component's sysctl is a literal beside the job's base_port: they must agree
    (docs/operations.md, "Ports"), else a restarted role may find its port taken."""
    objects = render(target)
    want = reserved_ports(job_of(objects).cluster.base_port)
    for name, workload in workloads(objects).items():
        if workload["kind"] != "StatefulSet":
            continue
        sysctls = {s["name"]: s["value"]
                   for s in workload["spec"]["template"]["spec"]["securityContext"]["sysctls"]}
        assert sysctls["net.ipv4.ip_local_reserved_ports"] == want, name


def test_the_base_job_needs_no_bucket_no_keys_and_no_data():
    """The first run: synthetic data, CURVE off, nothing in object storage, no export."""
    text = (KUBE / "base" / "job.toml").read_text()
    job = parse_job(text, "job.toml", Path("/etc/zbus"), environ={})
    assert job.data.source == "synthetic" and not job.data.path
    assert not job.cluster.curve_enabled()
    assert not job.checkpoint.dir and not job.checkpoint.export_dir
    assert job.checkpoint.export is False
    assert "s3://" not in text


def test_the_s3_overlays_job_reads_and_writes_object_storage_and_exports_in_one_place():
    text = (KUBE / "overlays" / "criteo-s3" / "job.toml").read_text()
    job = parse_job(text, "job.toml", Path("/etc/zbus"), environ={})
    assert job.cluster.curve == "on" and job.cluster.curve_enabled()
    assert job.data.path.startswith("s3://") and job.data.eval_path.startswith("s3://")
    assert job.checkpoint.dir.startswith("s3://")   # outlives every pod
    # every pod writes its part of the export beside the checkpoints: one place
    assert job.checkpoint.export and job.checkpoint.export_root("/var/lib/zbus/run") == \
        job.checkpoint.dir


@pytest.mark.parametrize("name", ["base", "overlays/criteo-s3"])
def test_the_shipped_jobs_use_only_keys_of_the_schema(name):
    """Every key of a shipped job.toml is a field of roles/job/settings.py (a typo is not
    ignored)."""
    def walk(cls: type, table: dict, path: tuple[str, ...]) -> None:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, value in table.items():
            assert key in fields, f"[{'.'.join(path)}] {key} is no job key"
            hint = typing.get_type_hints(cls)[key]
            if isinstance(value, dict) and dataclasses.is_dataclass(hint):
                walk(hint, value, (*path, key))

    walk(Job, tomllib.loads((KUBE / name / "job.toml").read_text()), ())


# ---- one template for every pod -------------------------------------------------------------

# what a role's own file sets: everything else of its pod comes from components/zbus-pod
OWN = ["name", "labels", "replicas", "selector", "control's prometheus.io annotations",
       "the container's command and resources"]


def shared_part(sts: dict) -> dict:
    """The StatefulSet without what its role's file sets."""
    sts = copy.deepcopy(sts)
    sts["metadata"].pop("name")
    sts["metadata"].pop("labels")
    sts["spec"].pop("replicas")
    sts["spec"].pop("selector")
    meta = sts["spec"]["template"]["metadata"]
    meta.pop("labels")
    meta.get("annotations", {}).pop("prometheus.io/scrape", None)
    meta.get("annotations", {}).pop("prometheus.io/port", None)
    meta.get("annotations", {}).pop("prometheus.io/path", None)
    container = only_container(sts)
    container.pop("command")
    container.pop("resources")
    return sts


@pytest.mark.integration
def test_the_statefulsets_differ_only_in_what_their_role_sets(base):
    sets = by_kind(base, "StatefulSet")
    shared = {name: shared_part(sts) for name, sts in sets.items()}
    first = shared.pop("zbus-control")
    for name, part in shared.items():
        assert part == first, f"{name} differs from zbus-control beyond {OWN}"
    # and the role files hold nothing else (the component holds the rest)
    import yaml
    for role in ROLES:
        own = yaml.safe_load((KUBE / "base" / f"{role}.yaml").read_text())
        spec = own["spec"]
        assert set(spec) <= {"replicas", "selector", "template"}, role
        assert set(spec["template"]) == {"metadata", "spec"}, role
        assert set(spec["template"]["spec"]) == {"containers"}, role
        assert set(only_container(own)) == {"name", "command", "resources"}, role


# ---- probes, security, metrics, GPUs --------------------------------------------------------

@pytest.mark.integration
def test_probes_are_exec_zbus_probe(base):
    for name, sts in by_kind(base, "StatefulSet").items():
        container = only_container(sts)
        assert container["livenessProbe"]["exec"]["command"] == ["zbus-probe", "live"], name
        assert container["startupProbe"]["exec"]["command"] == ["zbus-probe", "live"], name
        assert container["readinessProbe"]["exec"]["command"] == ["zbus-probe", "ready"], name
        live = container["livenessProbe"]
        # generous: the role's own window is 60 s; never restart a pod within it
        assert live["periodSeconds"] * live["failureThreshold"] >= 60, name


@pytest.mark.integration
@pytest.mark.parametrize("target", TARGETS)
def test_every_pod_runs_as_non_root_without_privileges(target):
    for name, workload in workloads(render(target)).items():
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == UID, name
        assert pod["enableServiceLinks"] is False, name
        assert pod["securityContext"]["fsGroup"] == UID, name  # reads the keys (mode 0440)
        keys = [v for v in pod["volumes"] if "secret" in v]
        assert [v["secret"]["defaultMode"] for v in keys] == [0o440], name
        for container in [*pod["containers"], *pod.get("initContainers", [])]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, name
            assert ctx["readOnlyRootFilesystem"] is True, name
            assert ctx["capabilities"]["drop"] == ["ALL"], name
            assert "memory" in container["resources"]["limits"], name
            assert {"cpu", "memory"} <= container["resources"]["requests"].keys(), name


@pytest.mark.integration
def test_worker_pods_have_time_to_leave_gracefully(base):
    from roles.worker.process import LEAVE_TIMEOUT_S
    pod = by_kind(base, "StatefulSet")["zbus-worker"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 4 * LEAVE_TIMEOUT_S


@pytest.mark.integration
@pytest.mark.parametrize("target", TARGETS)
def test_prometheus_annotations_on_control_match_the_jobs_metrics_port(target):
    objects = render(target)
    monitoring = job_of(objects).monitoring
    assert monitoring.prometheus_host == "0.0.0.0"  # scraped at the pod's address
    for name, sts in by_kind(objects, "StatefulSet").items():
        notes = sts["spec"]["template"]["metadata"].get("annotations", {})
        assert notes["kubectl.kubernetes.io/default-container"] == "zbus"
        if name != "zbus-control":
            assert not any(k.startswith("prometheus.io/") for k in notes), name
            continue
        assert notes["prometheus.io/scrape"] == "true"
        assert notes["prometheus.io/port"] == str(monitoring.prometheus_port)
        assert notes["prometheus.io/path"] == "/metrics"


@pytest.mark.integration
def test_the_gpu_overlay_gives_a_gpu_and_the_cuda_image_to_workers_only(base):
    before, after = by_kind(base, "StatefulSet"), by_kind(render("overlays/gpu"), "StatefulSet")
    assert before.keys() == after.keys()
    for name, sts in after.items():
        pod = sts["spec"]["template"]["spec"]
        if name == "zbus-worker":
            assert only_container(sts)["resources"]["limits"]["nvidia.com/gpu"] == 1
            assert {"key": "nvidia.com/gpu", "operator": "Exists",
                    "effect": "NoSchedule"} in pod["tolerations"]
            # the numba cache copied from the image the worker runs
            assert {c["image"] for c in [*pod["containers"], *pod["initContainers"]]} == \
                {"zbus-cuda"}
        else:
            assert sts == before[name], f"the GPU overlay changes {name}"
            assert "nvidia.com/gpu" not in str(sts)


@pytest.mark.integration
def test_the_s3_overlay_changes_the_namespace_image_counts_and_job_only(base):
    after = render("overlays/criteo-s3")
    images = {c["image"] for w in workloads(after).values()
              for c in [*w["spec"]["template"]["spec"]["containers"],
                        *w["spec"]["template"]["spec"].get("initContainers", [])]}
    assert images == {"registry.example.com/zbus:0.1.0-cpu"}
    assert job_of(after).cluster.shards == 4 and job_of(after).cluster.workers == 4
    changed = ["namespace", "images", "replicas (and the counts)", "the job"]

    def plain(objects: list[dict]) -> list[str]:
        """The objects without what the overlay may change."""
        out = []
        for o in copy.deepcopy(objects):
            o["metadata"].pop("namespace", None)
            if o["kind"] == "ConfigMap":
                o["metadata"]["name"], o["data"] = "zbus-job", {}
            o.get("spec", {}).pop("replicas", None)
            pod = o.get("spec", {}).get("template", {}).get("spec", {})
            for c in [*pod.get("containers", []), *pod.get("initContainers", [])]:
                c["image"] = "zbus"
                for e in c.get("env", []):
                    if e["name"].startswith("ZBUS_CLUSTER__"):
                        e["value"] = "n"
            for v in pod.get("volumes", []):
                if "configMap" in v:
                    v["configMap"]["name"] = "zbus-job"
            out.append(json.dumps(o, sort_keys=True))
        return sorted(out)

    assert plain(after) == plain(base), f"the overlay changes more than {changed}"


# ---- waiting for the end --------------------------------------------------------------------

@pytest.mark.integration
def test_the_wait_job_completes_when_the_job_completed_and_fails_when_it_ended_otherwise(base):
    """kubectl wait --for=condition=complete job/zbus-wait: the Job's pod runs zbus-ctl wait
    (exit 0: completed; 1: ended otherwise, the Job fails at once; 2: cannot tell, tried
    again); a resumable end is waited through (--supervised: zbus-pod resumes it)."""
    job = by_kind(base, "Job")["zbus-wait"]
    spec = job["spec"]
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and "initContainers" not in pod
    assert only_container(job)["command"] == ["zbus-ctl", "wait", "--supervised"]
    rules = spec["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"containerName": "zbus", "operator": "In",
                                                 "values": [wait.ENDED]}} in rules
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules
    assert wait.COMPLETED == 0 and spec["backoffLimit"] >= 1
    assert "ttlSecondsAfterFinished" not in spec, "kubectl wait must find the Job"
    # the waiter reads the job the nodes read, and their keys
    assert job_of(base, "zbus-wait") == job_of(base, "zbus-control")


# ---- the image ------------------------------------------------------------------------------

def dockerfile() -> list[tuple[str, str, str]]:
    """The Dockerfile's instructions as (stage, INSTRUCTION, arguments), continuations
    joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    steps, stage = [], ""
    for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", text, re.M):
        op, args = m.group(1).upper(), m.group(2).strip()
        if op == "FROM":
            stage = args.split()[-1]
        steps.append((stage, op, args))
    return steps


def stage_env(stage: str) -> dict[str, str]:
    """The variables the stage's ENV instructions set."""
    env = {}
    for _, _, args in (s for s in dockerfile() if s[0] == stage and s[1] == "ENV"):
        for word in shlex.split(args):
            key, _, value = word.partition("=")
            env[key] = value
    return env


def test_the_dockerfile_builds_a_non_root_image_entering_zbus_pod():
    steps = [(op, args) for _, op, args in dockerfile()]
    froms = [args for op, args in steps if op == "FROM"]
    assert [f.split()[-1] for f in froms] == ["build", "runtime"]
    assert any(op == "ARG" and args.startswith("PYTHON_IMAGE=python:3.11-slim")
               for op, args in steps)
    args = {a.split("=")[0] for op, a in steps if op == "ARG"}
    assert {"TORCH_INDEX", "TORCH_SPEC"} <= args
    assert ("ARG", "TORCH_INDEX=https://download.pytorch.org/whl/cpu") in steps
    run = " ".join(a for op, a in steps if op == "RUN")
    assert "scripts/setup.sh" in run and "ZBUS_VENV=/opt/zbus" in run
    assert "ZBUS_SETUP_EXTRAS= " in run  # no test tools in the image
    assert [a for op, a in steps if op == "USER"][-1].split(":")[0] == str(UID)
    assert steps[-1] == ("ENTRYPOINT", '["zbus-pod"]')
    assert stage_env("runtime")["PATH"] == "/opt/zbus/bin:$PATH"
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "ZBUS_TORCH_INDEX" in setup and "ZBUS_SETUP_EXTRAS" in setup


def test_every_file_the_dockerfile_copies_is_in_the_repository_and_the_build_context():
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    copies = [a.split() for _, op, a in dockerfile() if op == "COPY"]
    assert copies
    for words in copies:
        if any(w.startswith("--from=") for w in words):
            continue
        for source in words[:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
            top = source.split("/")[0]
            assert top not in ignored, f"COPY {source}: .dockerignore leaves it out"


LOOPS = {"roles.algorithms.shard.kernels": "loops", "roles.data.hashing": "compiled_loop",
         "roles.model.row_sums": "loop"}   # a shard's, a feeder's, a worker's


def build_snippet() -> str:
    """The Python the image's build runs to compile the loops (its RUN's python -c)."""
    run = " ".join(a for stage, op, a in dockerfile() if stage == "build" and op == "RUN")
    found = re.search(r'/opt/zbus/bin/python -c "([^"]*)"', run)
    assert found, "the build compiles no loops"
    return found.group(1)


def test_the_image_builds_every_roles_loops_into_the_numba_cache_its_pods_read():
    snippet = build_snippet()
    for module, function in LOOPS.items():
        assert f"from {module} import {function}" in snippet and f"{function}()" in snippet
    build, runtime = stage_env("build"), stage_env("runtime")
    assert build["NUMBA_CACHE_DIR"] == runtime["NUMBA_CACHE_DIR"]
    cache = runtime["NUMBA_CACHE_DIR"]
    copies = [a.split() for stage, op, a in dockerfile() if stage == "runtime" and op == "COPY"]
    # owned by the image's user: numba takes a cache directory only where it can write
    assert ["--from=build", f"--chown={UID}:{UID}", cache, cache] in copies


# A role's compiled loop made as a pod makes it: what numba compiled, and where the code came
# from. (The feeder's key loop: the same cache as every role's, and the quickest to build.)
PROBE = """
import json, numba
from numba.core import event
compiled = []
class Listener(event.Listener):
    def on_start(self, ev):
        compiled.append(ev.data["dispatcher"].py_func.__qualname__)
    def on_end(self, ev):
        pass
event.register("numba:compile", Listener())
import roles
from roles.data.hashing import compiled_loop
compiled_loop()
print(json.dumps({"compiled": compiled, "roles": roles.__file__,
                  "cache": numba.config.CACHE_DIR}))
"""
FEEDER_LOOP = "from roles.data.hashing import compiled_loop; compiled_loop()"


class ImageOnDisk:
    """The image's files under ``root/image`` and the pod's volumes under ``root/volumes``,
    with a container's paths mapped onto them: its mounts first, the image's root else."""

    def __init__(self, root: Path):
        self.image, self.volumes = root / "image", root / "volumes"

    def path(self, where: str, mounts: dict[str, Path] | None = None) -> str:
        # (joined as text: a path's meaning in a command may hang on a trailing "/.")
        for mount, disk in sorted((mounts or {}).items(), key=lambda m: -len(m[0])):
            if where == mount or where.startswith(mount.rstrip("/") + "/"):
                return f"{disk}{where[len(mount):]}"
        return f"{self.image}{where}"

    def mounts(self, container: dict) -> dict[str, Path]:
        out = {}
        for m in container.get("volumeMounts", []):
            disk = self.volumes / m["name"]
            disk.mkdir(parents=True, exist_ok=True)
            out[m["mountPath"]] = disk / m.get("subPath", "")
        return out

    def environ(self, env: dict[str, str], mounts: dict[str, Path]) -> dict[str, str]:
        """``env`` (the image's, the container's) on this disk: paths mapped, PATH the test's,
        the source tree on PYTHONPATH (the image's editable install of it)."""
        out = {k: self.path(v, mounts) if v.startswith("/") else v
               for k, v in env.items() if k != "PATH"}
        return {**out, "PATH": os.environ["PATH"], "LC_ALL": "C.UTF-8",
                "PYTHONPATH": self.path(dockerfile_workdir(), mounts)}


def dockerfile_workdir() -> str:
    return [a for stage, op, a in dockerfile() if stage == "build" and op == "WORKDIR"][-1]


def read_only(paths: list[Path]) -> tuple[list[str], typing.Callable[[], None]]:
    """A command prefix under which ``paths`` cannot be written, and what undoes it. Root
    writes through file modes: it gets a mount namespace with each path bound read-only."""
    if os.geteuid() != 0:
        for p in paths:
            subprocess.run(["chmod", "-R", "a-w", str(p)], check=True)
        return [], lambda: [subprocess.run(["chmod", "-R", "u+w", str(p)], check=True)
                            for p in paths]
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("root, and no mount namespace to make the image's files read-only in")
    binds = " && ".join(f"mount --bind {shlex.quote(str(p))} {shlex.quote(str(p))} && "
                        f"mount -o remount,bind,ro {shlex.quote(str(p))}" for p in paths)
    return ["unshare", "-m", "sh", "-c", f'{binds} && exec "$@"', "sh"], lambda: None


@pytest.mark.integration
def test_a_pod_runs_the_compiled_loops_the_image_built_without_compiling(tmp_path):
    """The image's source tree and numba cache, built as the Dockerfile builds them (its
    WORKDIR, its build stage's variables, its compile step); then the feeder's pod as the
    rendered manifests make it: its init containers, its mounts, the image's and the
    container's environment, the image's files read-only. The feeder's loop loads from the
    cache: numba compiles nothing (on the Dockerfile before NUMBA_CACHE_DIR it compiled
    _plain_loop and splitmix_one, into $HOME, in every pod)."""
    pytest.importorskip("numba")
    disk = ImageOnDisk(tmp_path)
    src = Path(disk.path(dockerfile_workdir()))
    for tree in ("roles", "zbus"):
        shutil.copytree(ROOT / tree, src / tree,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    assert FEEDER_LOOP.split("; ")[0] in build_snippet()
    built = subprocess.run([sys.executable, "-c", PROBE], cwd=src, capture_output=True,
                           text=True, timeout=120,
                           env=disk.environ({**stage_env("build"), "HOME": "/root"}, {}))
    assert built.returncode == 0, built.stderr
    assert "_plain_loop" in json.loads(built.stdout)["compiled"]   # the build did compile

    feeder = by_kind(render("base"), "StatefulSet")["zbus-feeder"]
    pod = feeder["spec"]["template"]["spec"]
    prefix, undo = read_only([disk.image])
    try:
        for init in pod.get("initContainers", []):
            mounts = disk.mounts(init)
            done = subprocess.run(prefix + [disk.path(a, mounts) if a.startswith("/") else a
                                            for a in init["command"]],
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, (init["name"], done.stderr)
        container = only_container(feeder)
        mounts = disk.mounts(container)
        env = disk.environ({**stage_env("runtime"), **env_of(container)}, mounts)
        ran = subprocess.run(prefix + [sys.executable, "-c", PROBE], cwd=disk.volumes,
                             env=env, capture_output=True, text=True, timeout=120)
    finally:
        undo()
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout)
    assert found["roles"].startswith(str(src))   # the image's tree, not the checkout
    assert found["compiled"] == [], f"the pod compiled {found['compiled']} (cache " \
        f"{found['cache']})"


# ---- spare worker keys ----------------------------------------------------------------------

def test_zbus_keys_makes_the_keys_of_as_many_workers_as_asked(tmp_path, monkeypatch, capsys):
    from roles.tools.keys import main
    monkeypatch.delenv("ZBUS_JOB", raising=False)
    monkeypatch.delenv("ZBUS_CLUSTER_FILE", raising=False)
    main(["--dir", str(tmp_path), "--workers", "5"])  # the built-in job: 2 workers
    made = {p.name.removesuffix(".key") for p in tmp_path.glob("*.key")}
    assert {f"worker-{i}" for i in range(5)} <= made
    assert {"control-0", "console", "ps-0", "feeder-0", "aggregator-0"} <= made
    assert "worker-5" not in made
    assert made == {p.name.removesuffix(".key") for p in (tmp_path / "allowed").glob("*.key")}
    main(["--dir", str(tmp_path), "--node", "worker-9", "--workers", "6"])
    assert "2 key pair(s) made" in capsys.readouterr().out.splitlines()[-1]  # 5 and 9
    assert {"worker-9", "worker-5"} <= {p.name.removesuffix(".key")
                                        for p in tmp_path.glob("*.key")}


def test_the_docs_never_change_the_readers_kube_context():
    """Every kubectl command in the docs names its namespace (-n, or an overlay's
    namespace:): none switches the reader's current context or namespace."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        for switch in ("config set-context", "config use-context", "kubens", "kubectx"):
            assert switch not in text, f"{page.name}: {switch}"
    k8s = (ROOT / "docs" / "operations.md").read_text().split("## On Kubernetes")[1]
    k8s = k8s.split("\n## ")[0]
    for line in re.findall(r"^\s*kubectl (?:apply|wait|logs|exec|scale|cp|create secret|"
                           r"delete|port-forward)\b.*$", k8s, re.M):
        assert " -n " in line or "overlays/criteo-s3" in line or "-n <" in line, line


# ---- zbus-serve: a Deployment and its Service (deploy/kubernetes/serving) -------------------

@pytest.mark.integration
def test_the_serving_deployment_is_valid_follows_the_job_through_control_and_is_ready_on_a_model():
    import kubernetes_validate

    from roles.serving.main import parse
    objects = render("serving")
    assert {o["kind"] for o in objects} == {"Deployment", "Service"}
    for version in newest_versions():
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)
    deployment = by_kind(objects, "Deployment")["zbus-serve"]
    pod = deployment["spec"]["template"]["spec"]
    container = only_container(deployment)
    assert container["command"] == ["zbus-serve"]
    args = parse(container["args"])   # what zbus-serve makes of them: no error
    s3_job = job_of(render("overlays/criteo-s3"))
    # it follows the job through its control (which names the checkpoints), with the
    # operator's CURVE keys where the job's pods keep theirs
    assert args.follow == s3_job.cluster.endpoint("control_req"), "serving follows control"
    assert s3_job.cluster.curve_enabled() and args.keys == s3_job.cluster.keys_dir
    assert args.host == "0.0.0.0"   # the pod's address, not only its loopback
    port = container["ports"][0]
    assert port["containerPort"] == args.port and port["name"] == "http"
    # ready once a model is loaded: the Service sends a pod nothing before
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    service = by_kind(objects, "Service")["zbus-serve"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(args.port)
    # as every zbus pod: not root, no privileges, a read-only root with /tmp and numba's
    # cache on the pod's own disks
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == UID
    for c in [*pod["containers"], *pod["initContainers"]]:
        ctx = c["securityContext"]
        assert ctx["readOnlyRootFilesystem"] is True and ctx["capabilities"]["drop"] == ["ALL"]
        assert ctx["allowPrivilegeEscalation"] is False
        assert "memory" in c["resources"]["limits"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert {"/tmp", "/opt/zbus-numba", args.keys} <= mounts.keys()
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[args.keys]]["secret"]["secretName"] == "zbus-keys"
