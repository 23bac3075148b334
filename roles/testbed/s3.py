"""A local S3 server for tests: moto's server mode (``moto[server]``) on a loopback port, in a
process group of its own that ``close()`` kills.

    with S3Server() as s3:            # or the ``s3`` fixture in conftest.py
        s3.env                        # AWS_ENDPOINT_URL and credentials, for the roles' env
        s3.uri("data/day1.tsv")       # s3://<bucket>/data/day1.tsv
        s3.put("data/day1.tsv", path) # upload a local file
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from zbus.sockets import free_tcp_ports

BUCKET = "zbus-test"


def s3_env(endpoint: str) -> dict[str, str]:
    """The AWS variables a process needs to reach the server (credentials moto accepts)."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true"}


class S3Server:
    def __init__(self, host: str = "127.0.0.1", port: int | None = None,
                 netns: str | None = None, log: Path | None = None):
        self.host = host
        self.port = port or free_tcp_ports(1, host if netns is None else "127.0.0.1")[0]
        self.endpoint = f"http://{host}:{self.port}"
        self.env = s3_env(self.endpoint)
        self.bucket = BUCKET
        self.netns = netns
        argv = [sys.executable, "-m", "moto.server", "-H", host, "-p", str(self.port)]
        if netns is not None:
            argv = ["ip", "netns", "exec", netns, *argv]
        out = open(log, "wb") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            self._wait_up(netns)
            self._run(netns, f"import boto3; boto3.client('s3').create_bucket(Bucket={BUCKET!r})")
        except BaseException:
            self.close()
            raise

    def _run(self, netns: str | None, code: str) -> None:
        """Python ``code`` with the server's AWS variables (in ``netns``: where the server
        is reachable), tried again for 30 s while the server starts."""
        argv = [sys.executable, "-c", code]
        if netns is not None:
            argv = ["ip", "netns", "exec", netns, *argv]
        deadline = time.monotonic() + 30
        while True:
            done = subprocess.run(argv, env={**os.environ, **self.env}, timeout=60,
                                  capture_output=True)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"against the S3 server: {done.stderr.decode()[-500:]}")
            time.sleep(0.3)

    def upload(self, key: str, path: Path) -> str:
        """Upload a local file as ``key`` from where the server is reachable (its network
        namespace, if it runs in one); its URI."""
        self._run(self.netns, "import boto3, sys; boto3.client('s3').upload_file("
                  f"{str(path)!r}, {self.bucket!r}, {key!r})")
        return self.uri(key)

    def _wait_up(self, netns: str | None) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}")
            if netns is not None:
                return  # _run's create_bucket retries through botocore; checked there
            try:
                urllib.request.urlopen(self.endpoint, timeout=1).read()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"moto server not up at {self.endpoint} within 30 s")

    def uri(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}" if key else f"s3://{self.bucket}"

    def fresh_prefix(self, name: str) -> str:
        """A prefix no other test uses: ``s3://<bucket>/<name>-<random>``."""
        return self.uri(f"{name}-{uuid.uuid4().hex[:8]}")

    def _fs(self):
        import pyarrow.fs as pafs
        return pafs.S3FileSystem(endpoint_override=self.endpoint, access_key="testing",
                                 secret_key="testing", region="us-east-1")

    def put(self, key: str, source: Path | bytes) -> str:
        """Upload a local file (or bytes) as ``key``; its URI."""
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        # compression=None: pyarrow would gzip a key named .gz again (its default, "detect")
        with self._fs().open_output_stream(f"{self.bucket}/{key}", compression=None) as f:
            f.write(data)
        return self.uri(key)

    def keys(self, prefix: str = "") -> list[str]:
        """The keys under ``prefix`` (a key, or an ``s3://`` URI of this bucket)."""
        import pyarrow.fs as pafs
        prefix = prefix.removeprefix(self.uri() + "/")
        infos = self._fs().get_file_info(pafs.FileSelector(f"{self.bucket}/{prefix}",
                                                           recursive=True, allow_not_found=True))
        return sorted(i.path.removeprefix(self.bucket + "/") for i in infos
                      if i.type == pafs.FileType.File)

    def get(self, key: str) -> bytes:
        key = key.removeprefix(self.uri() + "/")
        with self._fs().open_input_stream(f"{self.bucket}/{key}", compression=None) as f:
            return bytes(f.read())

    def delete(self, key: str) -> None:
        key = key.removeprefix(self.uri() + "/")
        self._fs().delete_file(f"{self.bucket}/{key}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
