"""The OIP v2 REST routes as a Starlette app over a :class:`~offload.serve.dataplane.DataPlane`.

Every answer is JSON (or the binary tensor extension), never a stack trace. Every response is
counted by status (``offload_responses_total{code}``).

Example::

    app = rest_app(plane)        # ASGI, for uvicorn or any server
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from offload.serve.auth import BearerAuth
from offload.serve.dataplane import DataPlane
from offload.serve.errors import BodyTooLarge, ServeError, UnknownModel
from offload.serve.metrics import CONTENT_TYPE_LATEST
from offload.serve.rest.codec import HEADER_LENGTH, decode_infer, encode_infer, encode_json

__all__ = ["rest_app"]

_log = logging.getLogger("offload.serve")


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(encode_json(obj), status_code=status, media_type="application/json", headers=headers)


def rest_app(plane: DataPlane, *, on_start: Callable[[], Awaitable[None]] | None = None, on_stop: Callable[[], Awaitable[None]] | None = None):
    """The ASGI app of ``plane``. ``on_start``/``on_stop`` run in its lifespan after the plane
    starts and before it stops (the gRPC listener of ``offload serve --grpc-port``)."""
    model = plane.model
    requests_by_code = plane.metrics.requests
    ok = requests_by_code.labels(model=model.name, code="200")  # the usual child, looked up once

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await plane.start()
        if on_start is not None:
            await on_start()
        try:
            yield
        finally:
            if on_stop is not None:  # answers the RPCs it has taken while the batcher still runs
                await on_stop()
            await plane.stop()

    def refuse(err: ServeError) -> Response:
        return _json({"error": str(err)}, plane.failed(err))

    async def server_meta(request: Request) -> Response:
        return _json(plane.server_metadata())

    async def live(request: Request) -> Response:
        return _json({"live": True})

    async def ready(request: Request) -> Response:
        ok = plane.ready()
        return _json({"ready": ok}, 200 if ok else 503)

    async def model_meta(request: Request) -> Response:
        try:
            plane.check_model(request.path_params["name"], request.path_params.get("version"))
        except UnknownModel as e:
            return refuse(e)
        return _json(model.metadata())

    async def model_ready(request: Request) -> Response:
        try:
            plane.check_model(request.path_params["name"], request.path_params.get("version"))
        except UnknownModel as e:
            return refuse(e)
        ok = plane.ready()
        return _json({"name": model.name, "ready": ok}, 200 if ok else 503)

    async def metrics(request: Request) -> Response:
        return Response(plane.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def infer(request: Request) -> Response:
        try:
            plane.check_model(request.path_params["name"], request.path_params.get("version"))
            body = await _read_body(request, plane.config.max_body_bytes)
            req = decode_infer(body, request.headers.get(HEADER_LENGTH), model.input, model.output, plane.config.max_batch_size)
            resp = await plane.infer(req)
        except ServeError as e:
            r = refuse(e)
            requests_by_code.labels(model=model.name, code=str(r.status_code)).inc()
            return r
        out, headers = encode_infer(resp)
        ok.inc()
        return Response(out, headers=headers)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        msg = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return _json({"error": msg}, exc.status_code, dict(exc.headers or {}))

    async def crash(request: Request, exc: Exception) -> Response:
        _log.exception("unhandled error on %s", request.url.path)
        plane.metrics.errors.labels(type="internal").inc()
        return _json({"error": "internal error"}, 500)

    # Starlette tries routes in order, a regular expression each: infer, nearly every request, first.
    routes = [
        Route("/v2/models/{name}/infer", infer, methods=["POST"]),
        Route("/v2/models/{name}/versions/{version}/infer", infer, methods=["POST"]),
        Route("/v2", server_meta),
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2/models/{name}", model_meta),
        Route("/v2/models/{name}/versions/{version}", model_meta),
        Route("/v2/models/{name}/ready", model_ready),
        Route("/v2/models/{name}/versions/{version}/ready", model_ready),
        Route("/metrics", metrics),
    ]
    inner = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error, Exception: crash})
    # Starlette answers "/v2/" with a redirect built from the client's Host header (an open
    # redirect); this service has no URL worth a redirect: such paths are 404s.
    inner.router.redirect_slashes = False
    app = _Responses(inner, plane)
    return BearerAuth(app, plane.config.api_key, count=app.count) if plane.config.api_key else app


async def _read_body(request: Request, limit: int) -> bytes:
    cl = request.headers.get("content-length")
    if cl is not None and cl.isdigit() and int(cl) > limit:
        raise BodyTooLarge(f"request body of {cl} bytes exceeds the limit of {limit} bytes")
    chunks, n = [], 0
    async for chunk in request.stream():  # a body without a length (chunked) is capped as it comes
        n += len(chunk)
        if n > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _Responses:
    """Counts every response by status."""

    def __init__(self, app, plane: DataPlane) -> None:
        self.app = app
        self._counter = plane.metrics.responses
        self._children: dict[int, object] = {}

    def count(self, status: int) -> None:
        child = self._children.get(status)
        if child is None:  # labels() takes a lock and formats the label: once per status
            child = self._children[status] = self._counter.labels(code=str(status))
        child.inc()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def counting_send(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.count(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:  # uvicorn answers 500 for an app that raised before responding
                self.count(500)
            raise
