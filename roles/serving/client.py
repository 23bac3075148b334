"""A client of ``zbus-serve`` (and of any Open Inference Protocol v2 server): rows as a data
file holds them (column name to its text) made into an infer request by the model's metadata
(``request_body``), and a kept-alive HTTP connection that sends them (``Client``). The tests,
the benchmarks and a user's own code speak to the server with it."""

from __future__ import annotations

import http.client
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson

from roles.data.readers import NULLS


def request_body(metadata: Mapping[str, Any], rows: Sequence[Mapping[str, str]],
                 request_id: str | None = None) -> bytes:
    """The infer request of ``rows`` (text values, as read from a file): a dense field's text
    as a number (a missing one, "" or "?", as null), a sparse field's as it is."""
    inputs = []
    for spec in metadata["inputs"]:
        name = spec["name"]
        texts = [row.get(name) for row in rows]
        if spec["datatype"] == "BYTES":
            data: list = texts
        else:
            data = [None if t is None or t.strip() in NULLS else float(t) for t in texts]
        inputs.append({"name": name, "datatype": spec["datatype"], "shape": [len(rows)],
                       "data": data})
    body: dict[str, Any] = {"inputs": inputs}
    if request_id is not None:
        body["id"] = request_id
    return orjson.dumps(body)


class Client:
    """One kept-alive connection to a server at ``url`` (``http://host:port``)."""

    def __init__(self, url: str, timeout_s: float = 30.0):
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80,
                                               timeout=timeout_s)

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        """The status and the decoded JSON body (the text of a body that is not JSON)."""
        headers = {"content-type": "application/json"} if body is not None else {}
        self.conn.request(method, path, body=body, headers=headers)
        reply = self.conn.getresponse()
        data = reply.read()
        try:
            return reply.status, orjson.loads(data)
        except orjson.JSONDecodeError:
            return reply.status, data.decode("utf-8", "replace")

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until the server says it is ready (a model loaded); a refused or reset connection
        meanwhile (a server starting) is tried again. TimeoutError past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.call("GET", "/v2/health/ready")[0] == 200:
                    return
            except OSError:
                self.conn.close()   # (http.client connects again at the next request)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server at {self.conn.host}:{self.conn.port} was not "
                                   f"ready within {timeout_s:g} s")
            time.sleep(0.05)

    def metadata(self, model: str) -> dict[str, Any]:
        status, body = self.call("GET", f"/v2/models/{model}")
        if status != 200:
            raise RuntimeError(f"GET /v2/models/{model}: {status} {body}")
        return body

    def infer(self, model: str, body: bytes) -> tuple[int, Any]:
        return self.call("POST", f"/v2/models/{model}/infer", body)

    def close(self) -> None:
        self.conn.close()
