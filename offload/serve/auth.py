"""Bearer-token check as a plain ASGI middleware (no per-request task or body buffering)."""

from __future__ import annotations

import hmac
from typing import Callable

import msgspec

from offload.serve.errors import Unauthorized, answer

__all__ = ["BearerAuth", "bearer_ok"]

_OPEN_PREFIX = "/v2/health/"


def bearer_ok(value: bytes, want: bytes) -> bool:
    """True when an ``Authorization`` value (HTTP header or gRPC metadata) carries the key ``want``."""
    # The scheme is case-insensitive (RFC 7235 section 2.1: "bearer" == "Bearer"); the token is
    # compared in constant time: response timing must not leak how much of the key matched.
    scheme, _, token = value.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(b" "), want)


class BearerAuth:
    """Answers 401 to any request without ``Authorization: Bearer <key>``; health probes stay open.

    Example::

        app = BearerAuth(app, api_key="s3cret")
    """

    def __init__(self, app, api_key: str, *, count: Callable[[int], None] | None = None) -> None:
        self.app = app
        self._want = api_key.encode()
        self._count = count  # sees each 401 (the metrics' response counter)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(_OPEN_PREFIX):
            await self.app(scope, receive, send)
            return
        got = b""
        for k, v in scope["headers"]:
            if k == b"authorization":
                got = v
                break
        if bearer_ok(got, self._want):
            await self.app(scope, receive, send)
            return
        err = Unauthorized(f"unauthorized: {'missing Authorization header' if not got else 'invalid API key'}; send 'Authorization: Bearer <key>'")
        status, _ = answer(err)
        if self._count is not None:
            self._count(status)
        body = msgspec.json.encode({"error": str(err)})
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
