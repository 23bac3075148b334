"""The HTTP side of ``zbus-serve``: an ASGI application (run by uvicorn) answering the Open
Inference Protocol v2 (``roles.serving.inference``) with the model a ``Holder`` holds now.

Routes: ``GET /v2/health/live``, ``GET /v2/health/ready`` (ready once a model is loaded),
``GET /v2`` (the server), ``GET /v2/models/<name>`` and ``.../ready`` (the model),
``POST /v2/models/<name>/infer`` (also under ``/versions/<version>/``: the version served now
only), ``GET /metrics`` (Prometheus). Anything else gets the protocol's error body,
``{"error": "..."}``, with its status; nothing a client sends raises out of the application.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from roles.serving.batcher import Batcher, NotReady
from roles.serving.inference import InferError, response, rows_of
from roles.serving.metrics import ServeMetrics
from roles.serving.served import Served

log = logging.getLogger("zbus.serve")

MAX_BODY_BYTES = 64 << 20
JSON = [(b"content-type", b"application/json")]


class Holder:
    """The model served now (None until one is loaded); a newer one replaces it whole."""

    def __init__(self, served: Served | None, metrics: ServeMetrics):
        self.served: Served | None = None
        self.metrics = metrics
        if served is not None:
            self.replace(served)

    def replace(self, served: Served) -> None:
        self.served = served
        self.metrics.loaded(served.round, served.trained_at)


class ServeApp:
    def __init__(self, holder: Holder, max_batch: int, max_wait_s: float):
        self.holder, self.metrics = holder, holder.metrics
        self.max_batch = max_batch
        self.batcher = Batcher(lambda: self.holder.served, max_batch, max_wait_s,
                               self.metrics.batch_rows.observe)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        started = time.monotonic()
        kind = kind_of(scope["path"])
        try:
            status, body, headers = await self.route(scope, receive)
        except InferError as exc:
            status, body, headers = exc.status, exc.body(), JSON
        except NotReady as exc:
            status, body, headers = 503, orjson.dumps({"error": str(exc)}), JSON
        except Exception as exc:   # a bug: the client hears of it, the server goes on
            log.exception("zbus-serve: %s %s", scope.get("method"), scope.get("path"))
            status, body, headers = 500, orjson.dumps({"error": f"internal error: {exc}"}), JSON
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        self.metrics.requests.labels(kind, str(status)).inc()
        if kind == "infer":
            took = time.monotonic() - started
            self.metrics.latency.observe(took)
            self.metrics.recent.request(took)

    async def lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.batcher.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def route(self, scope: dict, receive: Any) -> tuple[int, bytes, list]:
        method, path = scope["method"], scope["path"].rstrip("/")
        parts = path.split("/")[1:]
        served = self.holder.served
        if path == "/metrics":
            text, content_type = self.metrics.exposition(served.trained_at if served else None)
            return 200, text, [(b"content-type", content_type.encode())]
        if parts[:1] != ["v2"]:
            raise InferError(f"no route {path or '/'}: the Open Inference Protocol's are "
                             "under /v2", 404)
        if parts == ["v2", "health", "live"]:
            return self.answer(method, {"live": True})
        if parts == ["v2", "health", "ready"]:
            return self.answer(method, {"ready": served is not None},
                                         200 if served is not None else 503)
        if parts == ["v2"]:
            return self.answer(method, {"name": "zbus-serve", "version": "2",
                                                    "extensions": []})
        if len(parts) < 3 or parts[1] != "models":
            raise InferError(f"no route {path}", 404)
        name, rest = parts[2], parts[3:]
        if served is None:
            raise NotReady(f"model {name!r}: no model is loaded yet")
        if name != served.signature.name:
            raise InferError(f"unknown model {name!r}: this server serves "
                             f"{served.signature.name!r}", 404)
        if rest[:1] == ["versions"]:
            if len(rest) < 2 or rest[1] != served.version:
                raise InferError(f"model {name!r} version {rest[1] if len(rest) > 1 else ''!r} "
                                 f"is not served: the version served now is "
                                 f"{served.version!r}", 404)
            rest = rest[2:]
        if not rest:
            return self.answer(method, served.signature.metadata(served.version))
        if rest == ["ready"]:
            return self.answer(method, {"name": name, "ready": True})
        if rest == ["infer"]:
            if method != "POST":
                raise InferError(f"{path} takes POST, not {method}", 405)
            return await self.infer(await read_body(receive))
        raise InferError(f"no route {path}", 404)

    @staticmethod
    def answer(method: str, body: dict, status: int = 200) -> tuple[int, bytes, list]:
        if method not in ("GET", "HEAD"):
            raise InferError(f"takes GET, not {method}", 405)
        return status, orjson.dumps(body), JSON

    async def infer(self, body: bytes) -> tuple[int, bytes, list]:
        served = self.holder.served
        if served is None:
            raise NotReady("no model is loaded yet")
        request = rows_of(body, served.signature, self.max_batch)
        scored = await self.batcher.infer(request)
        self.metrics.rows.inc(len(request))
        self.metrics.recent.scored(len(request))
        return 200, response(served.signature, scored.version, request.id,
                             scored.probabilities), JSON


def kind_of(path: str) -> str:
    """What a path asks, as the request counter labels it."""
    if path.rstrip("/").endswith("/infer"):
        return "infer"
    if path.startswith("/v2/health") or path.rstrip("/").endswith("/ready"):
        return "health"
    if path == "/metrics":
        return "metrics"
    return "metadata" if path.startswith("/v2") else "other"


async def read_body(receive: Any) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InferError("the client went away before its request's body was read")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise InferError(f"a request body over {MAX_BODY_BYTES >> 20} MiB", 413)
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)
