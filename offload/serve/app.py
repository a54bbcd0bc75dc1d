"""The scoring service as an ASGI app: OIP v2 routes, dynamic batching, metrics, fail-over, auth.

Needs only a bundle and a device: no torch on the serving path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any, Awaitable, Callable, Mapping

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from offload import __version__
from offload.host.bundle import load
from offload.serve.auth import BearerAuth
from offload.serve.batcher import BatchOut, DynamicBatcher
from offload.serve.config import ServeConfig
from offload.serve.errors import BodyTooLarge, InvalidRequest, ServeError, UnknownModel, answer
from offload.serve.faults import FailoverRunner
from offload.serve.json_rows import compiled as compiled_json_rows
from offload.serve.metrics import CONTENT_TYPE_LATEST, FOLD_EVERY_S, ServeMetrics
from offload.serve.model import ServedModel, served_model
from offload.serve.oip import HEADER_LENGTH, JSON_HEADERS, InferRequest, LoneRows, encode_infer, encode_json, encode_json_rows, json_row_values, json_single_answers, parse_infer, stack_rows
from offload.sim.errors import InputError, InputKeyError, InputTypeError

__all__ = ["create_app", "ScoringService"]

_log = logging.getLogger("offload.serve")


# Lone single-row JSON answers kept by a service whose model has at most this many output rows.
_ANSWERS_MAX = 4096

(_RAW_JSON,) = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in JSON_HEADERS.items()]


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def _error(status: int, message: str) -> Response:
    return _json({"error": message}, status)


class ScoringService:
    """The state behind the routes: model, device runner, batcher, metrics.

    Example::

        svc = ScoringService(offload.load("risk_bundle"), ServeConfig(device="sim"))
        app = svc.app            # ASGI
    """

    def __init__(self, bundle: Any, config: ServeConfig | None = None, *, opener=None) -> None:
        self.config = cfg = config or ServeConfig()
        self.model: ServedModel = served_model(bundle)
        # The compiled JSON reader is built (or found in the build cache) now, not by a request.
        compiled_json_rows()
        self.metrics = ServeMetrics()
        kw = {"opener": opener} if opener is not None else {}
        probe = np.zeros((1, self.model.input.width))
        self.runner = FailoverRunner(
            self.model.kernel,
            cfg.device,
            n_out=self.model.output.width,
            fallback=cfg.fallback,
            metrics=self.metrics,
            model=self.model.name,
            timeout_s=cfg.device_timeout_ms / 1e3,
            reopen_backoff_s=cfg.reopen_backoff_s,
            probe=probe,
            **kw,
        )
        self.batcher = DynamicBatcher(
            self.runner.run,
            max_batch_size=cfg.max_batch_size,
            max_queue_delay_s=cfg.max_queue_delay_us / 1e6,
            max_queue_size=cfg.max_queue_size,
            metrics=self.metrics,
            model=self.model.name,
            run_inline=self.runner.run_inline if self.runner.inline else None,
            stack=stack_rows,
            alone=LoneRows(self.model.input.width),
        )
        self._request_hist = self.metrics.request_duration.labels(model=self.model.name)
        self._ok_counter = self.metrics.requests.labels(model=self.model.name, code="200")
        self._responses: dict[int, Any] = {}
        # The hot path's two counters of a 200, added to directly (LoopCounter children: plain numbers).
        self._ok_response = self._responses[200] = self.metrics.responses.labels(code="200")
        self.metrics.fallbacks.labels(model=self.model.name)  # exported as 0 from the start, not absent
        self._started = False
        self._folder: asyncio.TimerHandle | None = None  # the metrics' next fold, while started
        self.draining = False  # set first thing on SIGTERM: readiness goes off before anything closes
        self._timeout_s = cfg.request_timeout_ms / 1e3
        # The answer to a lone single-row JSON request without an id, by its output row's bytes:
        # a quantized score has few values (ServedModel.output_rows), so every answer is encoded
        # once and looked up after. Keyed by the bytes themselves, it is right for any output; the
        # bound only keeps models whose rows rarely repeat from paying for lookups that miss.
        self._answers: dict[bytes, bytes] | None = {} if self.model.output_rows <= _ANSWERS_MAX else None
        # The second protocol's listener (offload.serve.oip_grpc.GrpcEndpoint), set by serve() when
        # a gRPC port is asked for; it shares this service's batcher, runner and metrics.
        self.grpc: Any = None
        self.app = self._build()

    def count_response(self, status: int) -> None:
        """``offload_responses_total{code}`` += 1; labelled children cached (labels() locks)."""
        child = self._responses.get(status)
        if child is None:
            child = self._responses[status] = self.metrics.responses.labels(code=str(status))
        child.inc()

    async def _ensure_started(self) -> None:
        if not self._started:
            self._started = True
            await self.batcher.start()
            self._fold_every(asyncio.get_running_loop())

    def _fold_every(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bins the per-request histograms every FOLD_EVERY_S on the loop that observes them: their
        observations are plain appends (metrics.py), so this bounds what they hold between scrapes."""

        def fold() -> None:
            self.metrics.fold()
            self._folder = loop.call_later(FOLD_EVERY_S, fold)

        self._folder = loop.call_later(FOLD_EVERY_S, fold)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        await self._ensure_started()
        if self.grpc is not None:
            await self.grpc.start()
        try:
            yield
        finally:
            if self.grpc is not None:  # answers the RPCs it has taken, while the batcher still runs
                await self.grpc.stop(self.config.drain_timeout_s)
            await self.batcher.stop()
            if self._folder is not None:
                self._folder.cancel()
                self._folder = None
            self.runner.close()

    def _build(self):
        r = [
            Route("/v2", self._server_meta),
            Route("/v2/health/live", self._live),
            Route("/v2/health/ready", self._ready),
            Route("/v2/models/{name}", self._model_meta),
            Route("/v2/models/{name}/versions/{version}", self._model_meta),
            Route("/v2/models/{name}/ready", self._model_ready),
            Route("/v2/models/{name}/versions/{version}/ready", self._model_ready),
            Route("/v2/models/{name}/infer", self._infer, methods=["POST"]),
            Route("/v2/models/{name}/versions/{version}/infer", self._infer, methods=["POST"]),
            Route("/metrics", self._metrics),
        ]
        handlers = {HTTPException: self._http_error, Exception: self._crash}
        inner = Starlette(routes=r, lifespan=self._lifespan, exception_handlers=handlers)
        # Starlette answers "/v2/" with a redirect built from the client's Host header (an open
        # redirect); this service has no URL worth a redirect: such paths are 404s.
        inner.router.redirect_slashes = False
        # Every response is counted by status: the routed ones by a wrapper, the infer fast path
        # and the key check's 401s where they answer (no wrapper on the hot path).
        app = _asgi_app(self, _CountResponses(inner, self.count_response))
        return BearerAuth(app, self.config.api_key, count=self.count_response) if self.config.api_key else app

    # -- error pages: JSON, never a stack trace -------------------------------------------------
    async def _http_error(self, request: Request, exc: HTTPException) -> Response:
        msg = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return _error(exc.status_code, msg)

    async def _crash(self, request: Request, exc: Exception) -> Response:
        _log.exception("unhandled error on %s", request.url.path)
        self.metrics.errors.labels(type="internal").inc()
        return _error(500, "internal error")

    def _check_model(self, request: Request) -> None:
        name = request.path_params["name"]
        if name != self.model.name:
            raise UnknownModel(f"unknown model {name!r}; this server serves {self.model.name!r}")
        v = request.path_params.get("version")
        if v is not None and v != self.model.version:
            raise UnknownModel(f"model {name!r} has no version {v!r}; versions: [{self.model.version!r}]")

    # -- routes -----------------------------------------------------------------------------------
    async def _server_meta(self, request: Request) -> Response:
        return _json({"name": "offload", "version": __version__, "extensions": ["binary_tensor_data"]})

    async def _live(self, request: Request) -> Response:
        return _json({"live": True})

    def is_ready(self) -> bool:
        return self._started and not self.draining and (self.runner.state == "up" or self.config.fallback == "sim")

    async def _ready(self, request: Request) -> Response:
        ok = self.is_ready()
        return _json({"ready": ok}, 200 if ok else 503)

    async def _model_meta(self, request: Request) -> Response:
        try:
            self._check_model(request)
        except UnknownModel as e:
            return _error(e.status, e.message)
        return _json(self.model.metadata())

    async def _model_ready(self, request: Request) -> Response:
        try:
            self._check_model(request)
        except UnknownModel as e:
            return _error(e.status, e.message)
        ok = self.is_ready()
        return _json({"name": self.model.name, "ready": ok}, 200 if ok else 503)

    async def _metrics(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def _read_body(self, request: Request) -> bytes:
        limit = self.config.max_body_bytes
        cl = request.headers.get("content-length")
        if cl is not None and cl.isdigit() and int(cl) > limit:
            raise BodyTooLarge(f"request body of {cl} bytes exceeds the limit of {limit} bytes")
        chunks, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > limit:
                raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _infer(self, request: Request) -> Response:
        """The routed infer endpoint: other model names and versions (404s) end up here."""
        try:
            self._check_model(request)
            body = await self._read_body(request)
        except ServeError as e:
            status, out, headers = self._finish(e, time.perf_counter())
        else:
            status, out, headers = await self._score(body, request.headers.get(HEADER_LENGTH), time.perf_counter())
        return Response(out, status_code=status, headers=headers)

    def submit_rows(self, x: np.ndarray, finite: bool = False) -> tuple[BatchOut, int, int] | Awaitable[tuple[BatchOut, int, int]]:
        """The one data plane of both protocols for rows that came as an array: the kernel's input
        check, then the batcher (:meth:`DynamicBatcher.submit`'s answer, or its awaitable: await
        it at once, in the caller's own frame). ``x`` is [n, F] FP32 values (float32, or float64
        holding them), at most ``max_batch_size`` rows. ``finite``: the caller has proved every
        value finite (:func:`~offload.serve.oip.fp32_finite`), which is all the check has left to
        ask of such rows, so it is skipped. The service must have started (``_ensure_started``).
        REST's hot path takes the same two steps.

        Example::

            r = svc.submit_rows(rows)
            out, off, n = r if type(r) is tuple else await r     # rows off:off+n of out.y
        """
        if not finite:
            self._check_rows(x)
        return self.batcher.submit(x, self._timeout_s)

    def _check_rows(self, x: np.ndarray) -> None:
        try:
            self.model.validate(x)
        except (InputError, InputTypeError, InputKeyError) as e:  # the kind's documented refusals
            raise InvalidRequest(f"inputs[0].data: {e}") from None

    async def _score(self, body: bytes, header_length: str | None, t0: float) -> tuple[int, bytes, Mapping[str, str]]:
        """Parses, validates, queues and encodes one infer request: (status, body, headers).
        The routed infer's; the app's hot path (:func:`_asgi_app`) has the same steps inline."""
        try:
            req = self._request(body, header_length)
            if not self._started:
                await self._ensure_started()
            r = self.batcher.submit(req.x, self._timeout_s)
            shared, off, n = r if type(r) is tuple else await r
            out, headers = self._encode(req, shared, off, n)
        except ServeError as e:
            return self._finish(e, t0)
        self._request_hist.observe(time.perf_counter() - t0)
        self._ok_counter.value += 1
        return 200, out, headers

    def _request(self, body: bytes, header_length: str | None) -> InferRequest:
        """One infer request, parsed and checked (a ServeError otherwise)."""
        model = self.model
        req = parse_infer(body, header_length, model.input, model.output, self.config.max_batch_size, lazy_json=True)
        # Finite float rows of the model's width, at most max_batch_size (<= the kind's
        # MAX_BATCH) of them, are everything the mlp kind's input check asks for: rows the
        # parser proved finite (JSON, and small binary tensors) need no second look.
        if not req.finite:
            self._check_rows(req.x)
        return req

    def _encode(self, req: InferRequest, shared: BatchOut, off: int, n: int) -> tuple[bytes, Mapping[str, str]]:
        """The answer to ``req``: its rows ``off:off+n`` of the batch's output, as it asked."""
        model = self.model
        if req.binary_output:
            return encode_infer(model.name, model.version, req, shared.y[off : off + n], model.output)
        # The batch's values are encoded once, by whichever of its requests comes first, as one
        # text a row; a request that is its whole batch (a lone one) needs no row texts. The
        # id-less single-row answers, the usual ones, are made together at the first one's turn.
        texts = shared.derived  # [row texts, single-row answers or None]
        if texts is None:
            y = shared.y
            if n == y.shape[0]:
                answers = self._answers
                if n == 1 and req.id is None and answers is not None:
                    # Every request at one connection: a lookup where encoding was ~4.4 us in a
                    # real server (orjson, slicing and joins, cold; BENCHMARKS.md, round 19).
                    key = y.tobytes()
                    out = answers.get(key)
                    if out is None:
                        out = encode_json(model.name, model.version, None, y, model.output)
                        if len(answers) < _ANSWERS_MAX:  # bounded whatever bytes a device gives
                            answers[key] = out
                    return out, JSON_HEADERS
                return encode_json(model.name, model.version, req.id, y, model.output), JSON_HEADERS
            texts = shared.derived = [json_row_values(y), None]
        if n == 1 and req.id is None:
            ones = texts[1]
            if ones is None:
                ones = texts[1] = json_single_answers(model.name, model.version, texts[0], model.output)
            return ones[off], JSON_HEADERS
        return encode_json_rows(model.name, model.version, req.id, texts[0], off, n, model.output), JSON_HEADERS

    def _finish(self, err: ServeError, t0: float):
        status, err_type = answer(err)
        self._request_hist.observe(time.perf_counter() - t0)
        self.metrics.requests.labels(model=self.model.name, code=str(status)).inc()
        self.metrics.errors.labels(type=err_type).inc()
        return status, orjson.dumps({"error": str(err)}), JSON_HEADERS

    @staticmethod
    async def _rest_of_body(msg, receive, limit: int) -> bytes | None:
        """The body of a request that came in several messages (None: the client went away)."""
        chunks, n = [], 0
        while True:
            if msg["type"] == "http.disconnect":
                return None
            chunk = msg.get("body", b"")
            n += len(chunk)
            if n > limit:
                raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
            if not msg.get("more_body", False):
                return b"".join(chunks)
            msg = await receive()


def _asgi_app(svc: ScoringService, routed):
    """The service's ASGI app: POST /v2/models/<this model>/infer (or its version's URL) is
    answered here, as plain ASGI, without Starlette's routing, middleware and Request objects
    (about half the per-request cost of the app); everything else goes to ``routed``.

    One coroutine function for the whole hot path, not a dispatcher awaiting a handler: each
    coroutine between the request's task and the batcher's future is a frame to enter and leave
    on every resume (0.35-0.95 us a level at 64 connections, py-spy). A plain function, not a
    bound method or a class: uvicorn's interface detection (``Config.load``, 0.54) takes a
    coroutine function for ASGI 3 and would take a bound method for ASGI 2."""
    name, v = svc.model.name, svc.model.version
    paths = frozenset({f"/v2/models/{name}/infer", f"/v2/models/{name}/versions/{v}/infer"})
    rest_of_body = svc._rest_of_body
    model, max_batch = svc.model, svc.config.max_batch_size
    reader, in_name, in_type, in_width = compiled_json_rows(), model.input.name, model.input.datatype, model.input.width
    answers = svc._answers

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in paths:
            await routed(scope, receive, send)
            return
        t0 = time.perf_counter()
        # One C call instead of a Python loop over the headers; a repeated header keeps its last
        # value, as the loop did.
        headers = dict(scope["headers"])
        header_length = headers.get(b"inference-header-content-length")
        limit = svc.config.max_body_bytes
        try:
            msg = await receive()
            if msg["type"] == "http.request" and not msg.get("more_body", False):  # the whole body at once
                body = msg.get("body", b"")
                if len(body) > limit:  # its length is the Content-Length
                    raise BodyTooLarge(f"request body of {len(body)} bytes exceeds the limit of {limit} bytes")
            else:
                # A declared length past the limit is refused before the rest is read.
                content_length = headers.get(b"content-length")
                if content_length is not None and content_length.isdigit() and int(content_length) > limit:
                    raise BodyTooLarge(f"request body of {int(content_length)} bytes exceeds the limit of {limit} bytes")
                body = await rest_of_body(msg, receive, limit)
                if body is None:
                    return
        except BodyTooLarge as e:
            status, out, headers = svc._finish(e, t0)
        else:
            # _score's steps, inline, so that the batcher's awaitable is awaited in this frame (see above).
            try:
                try:
                    # _request's steps, inline too: one frame fewer on every request.
                    # The compiled reader's call, as parse_infer makes it, without parse_infer's frame.
                    x = None if header_length is not None or reader is None else reader(body, in_name, in_type, in_width, max_batch)
                    if x is not None:
                        req = InferRequest(x, None, False, True)
                    else:
                        req = parse_infer(body, None if header_length is None else header_length.decode("latin-1"), model.input, model.output, max_batch, lazy_json=True)
                        if not req.finite:
                            svc._check_rows(req.x)
                    if not svc._started:
                        await svc._ensure_started()
                    r = svc.batcher.submit(req.x, svc._timeout_s, x is not None)
                    if type(r) is tuple:  # computed at once, alone: the whole of its batch
                        shared, off, n = r
                        # _encode's memo, looked up here: its frame only for other answers and misses.
                        out = None
                        if n == 1 and x is not None and answers is not None:
                            out = answers.get(shared.y.tobytes())
                        if out is None:
                            out, headers = svc._encode(req, shared, off, n)
                        else:
                            headers = JSON_HEADERS
                    else:
                        shared, off, n = await r
                        out, headers = svc._encode(req, shared, off, n)
                except ServeError as e:
                    status, out, headers = svc._finish(e, t0)
                else:
                    status = 200
                    svc._request_hist.observe(time.perf_counter() - t0)
                    svc._ok_counter.value += 1
            except Exception:  # never a stack trace to the client; the log has it
                _log.exception("unhandled error in infer")
                svc.metrics.errors.labels(type="internal").inc()
                status, out, headers = 500, orjson.dumps({"error": "internal error"}), JSON_HEADERS
        if status == 200:
            svc._ok_response.value += 1
        else:
            svc.count_response(status)
        if headers is JSON_HEADERS:
            raw = [(b"content-length", str(len(out)).encode()), _RAW_JSON]
        else:
            raw = [(b"content-length", str(len(out)).encode())]
            raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": out})

    return app


class _CountResponses:
    """Counts the responses of the routed app by status: 404s and 405s of the router, 500s."""

    def __init__(self, app, count: Callable[[int], None]) -> None:
        self.app = app
        self._count = count

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def counting_send(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self._count(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:  # uvicorn answers 500 for an app that raised before responding
                self._count(500)
            raise


def create_app(bundle: Any, config: ServeConfig | None = None, **kw: Any):
    """The ASGI app serving ``bundle`` (a Bundle, or a path given to ``offload.load``).

    Example::

        app = create_app("risk_bundle", ServeConfig(device="sim", max_batch_size=64))
        # uvicorn.run(app, host="127.0.0.1", port=8000)
    """
    if isinstance(bundle, (str, bytes, os.PathLike)):
        bundle = load(bundle)
    return ScoringService(bundle, config, **kw).app
