"""The job's pods as a kubelet runs them, on the hosts of ``roles/testbed/netns.py``, for
tests: each pod's container command, environment, mounts and probes are taken from the rendered
manifests (``kubectl kustomize deploy/kubernetes/base``, offline), not written out again here.

- A pod runs its container in its host's network namespace, found by name (every namespace's
  ``/etc/hosts`` stands in for the cluster's DNS: ``Pods.place``), with its volumes mounted in a
  mount namespace of its own (``ip netns exec`` gives each command one): each ``emptyDir`` a
  fresh directory of that pod, the job's ConfigMap the test's job file, a Secret the test's
  directory for it; so every pod sees its own disk at the manifests' paths, and no other's.
- ``envFrom`` Secrets come from ``secrets``; ``fieldRef`` values are the pod's (its name); the
  image's environment is this checkout on ``PYTHONPATH`` with the venv's scripts on ``PATH``.
- A container that exits is started again in the same pod (same host, same disks), as
  ``restartPolicy: Always`` does, after ``BACKOFF_S`` (``tick``, called while the test waits).
- ``vanish``: the pod's host is gone without a word (its processes stopped: no FIN, no RST;
  its connections look open to their peers); the StatefulSet makes the pod again elsewhere
  (``create`` on another host: a new address under the same name, empty disks). ``delete``:
  SIGTERM to the container, as an eviction or ``kubectl delete pod`` does. ``crash``: the
  container killed (SIGKILL); the kubelet starts it again.

The mount points the manifests name are made on this machine when missing (empty directories
and one empty file) and removed by ``close``, with every process. Init containers are not run:
they copy the image's files (its compiled loops) into the pod, and there is no image here (the
roles run from this checkout, and numba's cache is this machine's).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from roles.testbed.jobs import REPO
from roles.testbed.local_cluster import BIN
from roles.testbed.netns import Hosts

BACKOFF_S = 1.0          # before a container that exited is started again
KUBE = REPO / "deploy" / "kubernetes"
STAGE = Path("/zbus-pod-checkout")   # a checkout a pod's volume would hide, kept in view here


def write_hosts(h: Hosts, names: dict[str, str]) -> None:
    """Each namespace's /etc/hosts (``ip netns exec`` bind-mounts /etc/netns/<ns>/hosts over
    it): ``names`` (name -> host a, b or c). Rewritten in place, the same inode: a bind mount
    keeps the old file when a new one is renamed over it."""
    text = "127.0.0.1 localhost\n" + "".join(f"{h.address[host]} {name}\n"
                                             for name, host in names.items())
    for host in ("a", "b", "c"):
        path = Path(f"/etc/netns/{h.names[host]}/hosts")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "r+" if path.exists() else "w") as f:
            f.seek(0)
            f.truncate()
            f.write(text)


def render(target: str = "base") -> list[dict]:
    """The manifests as ``kubectl kustomize`` renders them (offline)."""
    import yaml
    out = subprocess.run(["kubectl", "kustomize", str(KUBE / target)], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@dataclass
class Template:
    """One StatefulSet's pod template: what the test runs of it."""

    name: str                     # the StatefulSet's (zbus-ps): its pods are <name>-<i>
    role: str
    replicas: int
    command: list[str]
    env: list[dict]
    env_from: list[dict]
    mounts: list[dict]
    volumes: dict[str, dict]
    probes: dict[str, list[str]]  # live, ready: the exec probes' commands

    @classmethod
    def of(cls, sts: dict) -> Template:
        spec = sts["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        command = container["command"] + container.get("args", [])
        assert command[0] == "zbus-pod", command
        probes = {"live": container["livenessProbe"]["exec"]["command"],
                  "ready": container["readinessProbe"]["exec"]["command"]}
        return cls(sts["metadata"]["name"], command[1], sts["spec"]["replicas"], command,
                   container.get("env", []), container.get("envFrom", []),
                   container.get("volumeMounts", []),
                   {v["name"]: v for v in spec.get("volumes", [])}, probes)


def templates(docs: list[dict]) -> tuple[dict[str, Template], dict[str, str]]:
    """The pod templates by role, and the job ConfigMap's files."""
    found = {t.role: t for t in (Template.of(d) for d in docs if d["kind"] == "StatefulSet")}
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    return found, config["data"]


@dataclass
class Pod:
    node: str
    host: str
    uid: int
    root: Path                               # its emptyDirs are under here
    proc: subprocess.Popen | None = None
    exits: list[int] = field(default_factory=list)
    exited_at: float = 0.0
    gone: bool = False                       # vanished or deleted: not started again

    @property
    def name(self) -> str:
        return f"zbus-{self.node}"


class Pods:
    def __init__(self, hosts: Hosts, tmp_path: Path, docs: list[dict], job: Path,
                 secrets: dict[str, dict[str, str]], secret_dirs: dict[str, Path],
                 node_host: str, extra_args: dict[str, list[str]] | None = None):
        self.hosts, self.tmp = hosts, tmp_path
        self.templates, _ = templates(docs)
        self.job, self.secrets, self.secret_dirs = job, secrets, secret_dirs
        self.node_host = node_host
        self.extra_args = extra_args or {}
        self.pods: dict[str, Pod] = {}       # node -> its pod now
        self.all: list[Pod] = []
        self.placed: dict[str, str] = {}     # node -> host, as the DNS says
        self.made: list[Path] = []           # mount points made here (removed by close)
        self.uids = 0

    # -- pods --------------------------------------------------------------------------------
    def create(self, node: str, host: str) -> Pod:
        """A new pod for ``node`` on ``host`` (a new address, empty disks), its name pointed at
        it, its container started."""
        self.uids += 1
        pod = Pod(node, host, self.uids, self.tmp / "pods" / f"{node}-{self.uids}")
        self.pods[node] = pod
        self.all.append(pod)
        self.place(node, host)
        self.start(pod)
        return pod

    def place(self, node: str, host: str) -> None:
        """Every host's DNS (its /etc/hosts, rewritten in place: a bind mount keeps the inode)
        says ``node`` is on ``host``."""
        self.placed[node] = host
        write_hosts(self.hosts, {self.node_host.format(node=n): h
                                 for n, h in self.placed.items()})

    def template(self, node: str) -> Template:
        return self.templates[node.rsplit("-", 1)[0]]

    def environ(self, pod: Pod) -> dict[str, str]:
        t = self.template(pod.node)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ZBUS_", "AWS_"))}
        env.update({"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "PYTHONPATH": str(REPO)})
        for source in t.env_from:
            ref = source["secretRef"]
            if ref["name"] in self.secrets:
                env.update(self.secrets[ref["name"]])
            else:
                assert ref.get("optional"), f"no Secret {ref['name']} for {pod.name}"
        for var in t.env:
            if "value" in var:
                env[var["name"]] = var["value"]
            else:
                path = var["valueFrom"]["fieldRef"]["fieldPath"]
                assert path == "metadata.name", f"{var['name']}: {path} is not emulated here"
                env[var["name"]] = pod.name
        return env

    def mounts(self, pod: Pod) -> list[tuple[Path, str, bool]]:
        """(what, where, read-only) for each volume mount, those that would hide another's
        source last."""
        t = self.template(pod.node)
        out = []
        for m in t.mounts:
            volume = t.volumes[m["name"]]
            if "emptyDir" in volume:
                source = pod.root / m["name"]
                source.mkdir(parents=True, exist_ok=True)
            elif "configMap" in volume:
                assert m.get("subPath") == self.job.name, m   # the job file
                source = self.job
            elif "secret" in volume:
                source = self.secret_dirs[volume["secret"]["secretName"]]
            else:
                raise AssertionError(f"volume {volume} is not emulated here")
            if m.get("subPath") and "configMap" not in volume:
                source = source / m["subPath"]
            out.append((source, m["mountPath"], bool(m.get("readOnly"))))
        return sorted(out, key=lambda x: any(str(s).startswith(x[1].rstrip("/") + "/")
                                             for s, _, _ in out))

    def in_pod(self, pod: Pod, argv: list[str]) -> list[str]:
        """``argv`` in the pod: its host's network namespace, its volumes mounted. A checkout
        (and its commands) under a volume's mount path (a clone in /tmp, where the pods mount
        an emptyDir) is put back at its path over that volume, as the image has it."""
        mounts = self.mounts(pod)
        hidden = [ours for ours in dict.fromkeys((REPO, BIN))
                  if any(str(ours).startswith(target.rstrip("/") + "/")
                         for _, target, _ in mounts)]
        hidden = [h for h in hidden if not any(h != o and o in h.parents for o in hidden)]
        script = ["set -e"]
        stages = [STAGE / str(i) for i in range(len(hidden))]
        for ours, stage in zip(hidden, stages, strict=True):   # kept in view before the mounts
            self.mount_point(stage, True)
            script.append(f"mount --bind {shlex.quote(str(ours))} {shlex.quote(str(stage))}")
        for source, target, read_only in mounts:
            self.mount_point(Path(target), source.is_dir())
            script.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}")
            if read_only:
                script.append(f"mount -o remount,bind,ro {shlex.quote(target)}")
        for ours, stage in zip(hidden, stages, strict=True):   # and back where it was
            script.append(f"mkdir -p {shlex.quote(str(ours))}")
            script.append(f"mount --bind {shlex.quote(str(stage))} {shlex.quote(str(ours))}")
        script.append('exec "$@"')
        return ["ip", "netns", "exec", self.hosts.names[pod.host], "sh", "-c",
                "\n".join(script), "sh", *argv]

    def mount_point(self, target: Path, directory: bool) -> None:
        if target.exists():
            return
        missing = [p for p in [target, *target.parents] if not p.exists()]
        for p in reversed(missing):
            if p == target and not directory:
                p.touch()
            else:
                p.mkdir()
            self.made.append(p)

    def start(self, pod: Pod) -> None:
        t = self.template(pod.node)
        argv = [*t.command, *self.extra_args.get(t.role, [])]
        log = self.tmp / f"{pod.node}-{pod.uid}.log"
        with open(log, "ab") as out:
            out.write(f"--- started {time.strftime('%H:%M:%S')} on host {pod.host}\n".encode())
            out.flush()
            pod.proc = subprocess.Popen(self.in_pod(pod, argv), env=self.environ(pod),
                                        cwd=self.tmp, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def tick(self) -> None:
        """Containers that exited are started again (the pod lives on: same disks)."""
        now = time.monotonic()
        for pod in self.pods.values():
            if pod.gone or pod.proc is None or pod.proc.poll() is None:
                continue
            if not pod.exited_at:
                pod.exits.append(pod.proc.returncode)
                pod.exited_at = now
            elif now - pod.exited_at >= BACKOFF_S:
                pod.exited_at = 0.0
                self.start(pod)

    # -- what happens to pods ------------------------------------------------------------------
    def vanish(self, node: str) -> Pod:
        """Its host is gone without a word: its processes stop where they are."""
        pod = self.pods[node]
        pod.gone = True
        signal_group(pod, signal.SIGSTOP)
        return pod

    def delete(self, node: str, timeout: float = 60.0) -> int:
        """SIGTERM to the container (an eviction, a drain, ``kubectl delete pod``); its exit
        status once it has exited."""
        pod = self.pods[node]
        pod.gone = True
        assert pod.proc is not None
        pod.proc.send_signal(signal.SIGTERM)
        return pod.proc.wait(timeout=timeout)

    def crash(self, node: str) -> None:
        """The container is killed; the kubelet starts it again (``tick``)."""
        pod = self.pods[node]
        signal_group(pod, signal.SIGKILL)
        assert pod.proc is not None
        pod.proc.wait(timeout=30)

    def probe(self, node: str, kind: str) -> subprocess.CompletedProcess:
        """The manifest's exec probe, in the pod."""
        pod = self.pods[node]
        return subprocess.run(self.in_pod(pod, self.template(node).probes[kind]),
                              env=self.environ(pod), capture_output=True, text=True,
                              timeout=60)

    def disk(self, node: str, volume: str) -> Path:
        """Where the pod's emptyDir ``volume`` is, seen from here."""
        return self.pods[node].root / volume

    def log(self, node: str) -> str:
        pod = self.pods[node]
        path = self.tmp / f"{node}-{pod.uid}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self, tail: int = 2500) -> str:
        said = []
        for p in self.all:
            path = self.tmp / f"{p.node}-{p.uid}.log"
            if path.exists():
                said.append(f"--- {p.node} (pod {p.uid}, {p.host}{', gone' if p.gone else ''})"
                            f"\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(said)

    def close(self) -> None:
        for pod in self.all:
            signal_group(pod, signal.SIGKILL)
            if pod.proc is not None:
                try:
                    pod.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    print(f"{pod.name}: not reaped", file=sys.stderr)
        for path in reversed(self.made):
            try:
                path.rmdir() if path.is_dir() else path.unlink()
            except OSError:
                pass


def signal_group(pod: Pod, sig: int) -> None:
    if pod.proc is None:
        return
    try:
        os.killpg(pod.proc.pid, sig)
        if sig == signal.SIGKILL:
            os.killpg(pod.proc.pid, signal.SIGCONT)
    except (ProcessLookupError, PermissionError):
        pass
