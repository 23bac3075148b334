"""The Kubernetes manifests (deploy/kubernetes) and the container image (Dockerfile) hold
together: every rendered object is valid for the two newest Kubernetes versions that
kubernetes-validate knows (its OpenAPI schemas, offline, strict: no unknown field), and the
manifests agree with the example job they ship (pod names, ports, roles, probes, security,
metrics). Nothing here needs a cluster or a container engine: ``kubectl kustomize`` renders
offline, and the image is checked by reading its Dockerfile."""

from __future__ import annotations

import dataclasses
import functools
import re
import shutil
import subprocess
import tomllib
import typing
from pathlib import Path

import pytest

from roles.job.settings import parse_job
from roles.protocol.topology import ClusterConfig

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "deploy" / "kubernetes"
JOB_FILE = KUBE / "base" / "job.toml"
SERVICE = "zbus"
ROLES = ("control", "feeder", "ps", "aggregator", "worker")
# what each StatefulSet's replicas must equal in the job's [cluster] (control: one)
COUNT_KEY = {"feeder": "feeders", "ps": "shards", "aggregator": "aggregators",
             "worker": "workers"}
UID = 10001


@functools.cache
def kustomize(target: str) -> str:
    """``kubectl kustomize`` of ``deploy/kubernetes/<target>`` (offline), once per session."""
    return subprocess.run(["kubectl", "kustomize", str(KUBE / target)], check=True,
                          capture_output=True, text=True, timeout=60).stdout


def render(target: str) -> list[dict]:
    import yaml
    if shutil.which("kubectl") is None:
        pytest.skip("no kubectl to render the kustomization with")
    return [doc for doc in yaml.safe_load_all(kustomize(target)) if doc]


@pytest.fixture(scope="module")
def base() -> list[dict]:
    return render("base")


@pytest.fixture(scope="module")
def gpu() -> list[dict]:
    return render("overlays/gpu")


def newest_versions(n: int = 2) -> list[str]:
    """The ``n`` newest Kubernetes minor versions whose schemas kubernetes-validate ships."""
    from kubernetes_validate import utils
    minors = {utils.major_minor(v): v for v in utils.all_versions()}
    return [minors[m] for m in sorted(minors, key=lambda m: tuple(map(int, m.split("."))))[-n:]]


def job_table() -> dict:
    return tomllib.loads(JOB_FILE.read_text())


def cluster_of_job() -> ClusterConfig:
    """The job's [cluster] as the topology reads it (keys this branch's schema may not know
    yet, such as node_host, left out: the counts and ports do not depend on them)."""
    known = {f.name for f in dataclasses.fields(ClusterConfig)}
    return ClusterConfig(**{k: v for k, v in job_table()["cluster"].items() if k in known})


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def only_container(sts: dict) -> dict:
    containers = sts["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{sts['metadata']['name']}: one container per pod"
    return containers[0]


def job_configmap(objects: list[dict]) -> dict:
    maps = [o for name, o in by_kind(objects, "ConfigMap").items()
            if name.startswith("zbus-job")]
    assert len(maps) == 1
    return maps[0]


# ---- every object valid for the two newest Kubernetes versions -------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("target", ["base", "overlays/gpu"])
def test_every_rendered_object_is_valid_for_the_two_newest_kubernetes_versions(target):
    import kubernetes_validate
    objects = render(target)
    versions = newest_versions()
    assert len(versions) == 2
    kinds = {o["kind"] for o in objects}
    assert kinds == {"ConfigMap", "Service", "StatefulSet"}, "built-in kinds only"
    for version in versions:
        for obj in objects:
            # raises ValidationError (a bad or unknown field, strict) or SchemaNotFoundError
            kubernetes_validate.validate(obj, version, strict=True)
    # the validator does catch a mistake (so that the loop above is not vacuous)
    broken = dict(by_kind(objects, "Service")["zbus"])
    broken["spec"] = {**broken["spec"], "clusterIp": "None"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, versions[-1], strict=True)


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


@pytest.mark.integration
def test_each_container_runs_zbus_pod_with_its_statefulsets_role(base):
    for name, sts in by_kind(base, "StatefulSet").items():
        container = only_container(sts)
        assert container["command"] == ["zbus-pod", name.removeprefix("zbus-")]
        assert "args" not in container
        env = {e["name"]: e for e in container["env"]}
        assert env["ZBUS_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["ZBUS_BIND_INTERFACE"]["value"] == "*"
        assert env["ZBUS_JOB"]["value"] == "/etc/zbus/job.toml"
        assert env["ZBUS_RUN_DIR"]["value"] == "/var/lib/zbus/run"
        assert {"secretRef": {"name": "zbus-s3", "optional": True}} in container["envFrom"]


@pytest.mark.integration
def test_pod_names_are_the_jobs_node_ids_under_node_host(base):
    table = job_table()["cluster"]
    cluster = cluster_of_job()
    node_host = table["node_host"]
    sets = by_kind(base, "StatefulSet")
    assert sets["zbus-control"]["spec"]["replicas"] == 1
    for role, key in COUNT_KEY.items():
        assert sets[f"zbus-{role}"]["spec"]["replicas"] == getattr(cluster, key), \
            f"zbus-{role} replicas != [cluster] {key}"
    pods = {f"{name}-{i}" for name, sts in sets.items() for i in range(sts["spec"]["replicas"])}
    nodes = ["control-0", *cluster.expected_nodes()]
    # node ps-3 binds at zbus-ps-3.zbus: pod zbus-ps-3 of the Service zbus
    assert {node_host.format(node=n) for n in nodes} == {f"{p}.{SERVICE}" for p in pods}
    # and the owner of every endpoint is one of those pods
    owners = {cluster.endpoint_owner(e) for e in cluster.endpoint_names()}
    assert {f"zbus-{o}" for o in owners} <= pods


@pytest.mark.integration
def test_the_service_lists_every_port_the_jobs_endpoints_use(base):
    cluster = cluster_of_job()
    assert cluster.parts == 1, "model-parallel members have no StatefulSet here"
    wanted = {int(cluster.endpoint(e).rsplit(":", 1)[1]) for e in cluster.endpoint_names()}
    ports = by_kind(base, "Service")[SERVICE]["spec"]["ports"]
    assert {p["port"] for p in ports} == wanted
    assert all(p["targetPort"] == p["port"] for p in ports)
    assert len({p["name"] for p in ports}) == len(ports)


# ---- the job file in the ConfigMap ---------------------------------------------------------

@pytest.mark.integration
def test_the_configmap_holds_the_example_job_mounted_where_zbus_job_says(base):
    text = job_configmap(base)["data"]["job.toml"]
    assert text == JOB_FILE.read_text()
    for sts in by_kind(base, "StatefulSet").values():
        pod = sts["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in only_container(sts)["volumeMounts"]}
        job = mounts["/etc/zbus/job.toml"]
        assert volumes[job["name"]]["configMap"]["name"] == job_configmap(base)["metadata"]["name"]
        assert job["subPath"] == "job.toml"
        keys = mounts[job_table()["cluster"]["keys_dir"]]
        assert volumes[keys["name"]]["secret"]["secretName"] == "zbus-keys"
        assert "emptyDir" in volumes[mounts["/var/lib/zbus"]["name"]]
        assert "emptyDir" in volumes[mounts["/tmp"]["name"]]


def test_the_example_job_parses_with_the_job_schema():
    table = job_table()
    job = parse_job(JOB_FILE.read_text(), str(JOB_FILE), JOB_FILE.parent, environ={})
    assert job.cluster.curve == "on" and job.cluster.keys_dir == table["cluster"]["keys_dir"]
    # every endpoint's host is node_host with the node that binds it
    for name in job.cluster.endpoint_names():
        owner = job.cluster.endpoint_owner(name)
        host = table["cluster"]["node_host"].format(node=owner)
        assert job.cluster.endpoint(name).startswith(f"tcp://{host}:"), name
    assert job.checkpoint.dir == table["checkpoint"]["dir"]
    assert job.checkpoint.dir.startswith("s3://")   # outlives every pod
    assert job.data.path.startswith("s3://") and job.data.eval_path.startswith("s3://")


def test_the_example_job_uses_only_keys_of_the_schema():
    """Every key of job.toml is a field of roles/job/settings.py (a typo is not ignored)."""
    from roles.job.settings import Job

    def walk(cls: type, table: dict, path: tuple[str, ...]) -> None:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, value in table.items():
            assert key in fields, f"[{'.'.join(path)}] {key} is no job key"
            hint = typing.get_type_hints(cls)[key]
            if isinstance(value, dict) and dataclasses.is_dataclass(hint):
                walk(hint, value, (*path, key))

    walk(Job, job_table(), ())


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
@pytest.mark.parametrize("target", ["base", "overlays/gpu"])
def test_every_pod_runs_as_non_root_without_privileges(target):
    for name, sts in by_kind(render(target), "StatefulSet").items():
        pod = sts["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == UID, name
        assert pod["enableServiceLinks"] is False, name
        assert pod["securityContext"]["fsGroup"] == UID, name  # reads the keys (mode 0440)
        keys = [v for v in pod["volumes"] if "secret" in v]
        assert [v["secret"]["defaultMode"] for v in keys] == [0o440], name
        container = only_container(sts)
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False, name
        assert ctx["readOnlyRootFilesystem"] is True, name
        assert ctx["capabilities"]["drop"] == ["ALL"], name
        assert "memory" in container["resources"]["limits"], name
        assert {"cpu", "memory"} <= container["resources"]["requests"].keys(), name


@pytest.mark.integration
def test_worker_pods_have_time_to_leave_gracefully(base):
    from roles.worker import LEAVE_TIMEOUT_S
    pod = by_kind(base, "StatefulSet")["zbus-worker"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 4 * LEAVE_TIMEOUT_S


@pytest.mark.integration
def test_prometheus_annotations_on_control_match_the_jobs_metrics_port(base):
    monitoring = job_table()["monitoring"]
    assert monitoring["prometheus_host"] == "0.0.0.0"  # scraped at the pod's address
    for name, sts in by_kind(base, "StatefulSet").items():
        notes = sts["spec"]["template"]["metadata"].get("annotations", {})
        if name != "zbus-control":
            assert not any(k.startswith("prometheus.io/") for k in notes), name
            continue
        assert notes["prometheus.io/scrape"] == "true"
        assert notes["prometheus.io/port"] == str(monitoring["prometheus_port"])
        assert notes["prometheus.io/path"] == "/metrics"


@pytest.mark.integration
def test_the_gpu_overlay_gives_a_gpu_to_workers_only(base, gpu):
    before, after = by_kind(base, "StatefulSet"), by_kind(gpu, "StatefulSet")
    assert before.keys() == after.keys()
    for name, sts in after.items():
        container = only_container(sts)
        pod = sts["spec"]["template"]["spec"]
        if name == "zbus-worker":
            assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
            assert {"key": "nvidia.com/gpu", "operator": "Exists",
                    "effect": "NoSchedule"} in pod["tolerations"]
            assert "cuda" in container["image"] and container["image"] != \
                only_container(before[name])["image"]
        else:
            assert sts == before[name], f"the GPU overlay changes {name}"
            assert "nvidia.com/gpu" not in str(sts)


# ---- the image ------------------------------------------------------------------------------

def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, arguments), continuations joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    return [(m.group(1).upper(), m.group(2).strip()) for m in
            re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", text, re.M)
            if not m.group(0).lstrip().startswith("#")]


def test_the_dockerfile_builds_a_non_root_image_entering_zbus_pod():
    steps = dockerfile()
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
    env = " ".join(a for op, a in steps if op == "ENV")
    assert "PATH=/opt/zbus/bin:$PATH" in env
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "ZBUS_TORCH_INDEX" in setup and "ZBUS_SETUP_EXTRAS" in setup


def test_every_file_the_dockerfile_copies_is_in_the_repository_and_the_build_context():
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    copies = [a.split() for op, a in dockerfile() if op == "COPY"]
    assert copies
    for words in copies:
        if any(w.startswith("--from=") for w in words):
            continue
        for source in words[:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
            top = source.split("/")[0]
            assert top not in ignored, f"COPY {source}: .dockerignore leaves it out"


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
