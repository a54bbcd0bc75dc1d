"""The service's errors and the one table that says how each is answered over HTTP and gRPC.

Every class is an :class:`offload.sim.errors.OffloadError`. A route or RPC never picks a status
itself: it raises one of these, and :func:`answer` (HTTP) or :func:`grpc_answer` (gRPC) looks the
class up in :data:`HTTP_STATUS`, which also gives the ``type`` label of ``offload_errors_total``. (Only the router's own 404/405 for paths and
methods no route has, and the 500 of an unexpected exception, come from elsewhere.)

Example::

    raise InvalidRequest("inputs[0].shape: expected [batch, 16], got [3]")
    status, kind = answer(err)          # (400, "bad_request")
    code, kind = grpc_answer(err)       # ("INVALID_ARGUMENT", "bad_request")
"""

from __future__ import annotations

from offload.sim.errors import DeviceError, DeviceTimeout, OffloadError

__all__ = [
    "ServeError",
    "RequestError",
    "InvalidRequest",
    "Unauthorized",
    "UnknownModel",
    "BodyTooLarge",
    "HeadTooLarge",
    "UriTooLong",
    "HeadTimeout",
    "QueueFull",
    "ShuttingDown",
    "DeviceUnavailable",
    "BadDeviceOutput",
    "RequestTimeout",
    "ConfigError",
    "DeviceOutputError",
    "DeviceAbandoned",
    "HTTP_STATUS",
    "answer",
    "grpc_answer",
]


class ServeError(OffloadError):
    """An error the service answers over HTTP; its status comes from :data:`HTTP_STATUS`."""

    @property
    def status(self) -> int:
        return answer(self)[0]

    @property
    def message(self) -> str:
        return str(self)


class RequestError(ServeError, ValueError):
    """A request the service refuses: the client's mistake (4xx)."""


class InvalidRequest(RequestError):
    """A malformed infer body or header; the message names the field and the limit."""


class Unauthorized(RequestError):
    """No ``Authorization: Bearer <key>`` with the service's key."""


class UnknownModel(RequestError, LookupError):
    """A model name or version this server does not serve."""


class BodyTooLarge(RequestError):
    """A request body over ``max_body_bytes``."""


class HeadTooLarge(RequestError):
    """A request head over ``max_head_bytes`` or with too many header fields."""


class UriTooLong(RequestError):
    """A request target over the request-line limit."""


class HeadTimeout(RequestError, TimeoutError):
    """A request head not fully received within ``header_timeout_s``."""


class QueueFull(ServeError, RuntimeError):
    """The batch queue holds ``max_queue_size`` requests already."""


class ShuttingDown(ServeError, RuntimeError):
    """The service is draining on SIGTERM and takes no new work."""


class DeviceUnavailable(ServeError, RuntimeError):
    """The device failed and the service is configured to answer 503 rather than fall back."""


class BadDeviceOutput(ServeError, RuntimeError):
    """The device answered with outputs that break the model's declared outputs, and no fall-back
    re-ran the batch: the numbers are wrong, so the client gets none of them."""


class RequestTimeout(ServeError, TimeoutError):
    """A request was not answered within ``request_timeout_ms``."""


class ConfigError(OffloadError, ValueError):
    """A service setting out of range, refused at start-up; the message names the setting and limit."""


class DeviceOutputError(DeviceError):
    """A device returned outputs of the wrong shape, a flattened output or non-finite values."""


class DeviceAbandoned(DeviceTimeout):
    """A device call ran past the service's own deadline (it ignored its timeout); the call's thread
    and the device handle were abandoned and a fresh handle is being opened."""


# The one place a serve error becomes a status: HTTP status, the ``type`` label of
# offload_errors_total, and the gRPC status code's name (grpc.StatusCode[name]; kept as a string so
# this module needs no grpc). gRPC codes follow Triton's and grpc's own choices: a refused message
# size is RESOURCE_EXHAUSTED (what grpc core answers for max_receive_message_length), an overloaded
# or draining server UNAVAILABLE (the code clients retry), a missed deadline DEADLINE_EXCEEDED.
HTTP_STATUS: dict[type[ServeError], tuple[int, str, str]] = {
    InvalidRequest: (400, "bad_request", "INVALID_ARGUMENT"),
    Unauthorized: (401, "unauthorized", "UNAUTHENTICATED"),
    UnknownModel: (404, "unknown_model", "NOT_FOUND"),
    HeadTimeout: (408, "head_timeout", "DEADLINE_EXCEEDED"),
    BodyTooLarge: (413, "too_large", "RESOURCE_EXHAUSTED"),
    UriTooLong: (414, "uri_too_long", "INVALID_ARGUMENT"),
    HeadTooLarge: (431, "head_too_large", "RESOURCE_EXHAUSTED"),
    BadDeviceOutput: (500, "bad_output", "INTERNAL"),
    QueueFull: (503, "queue_full", "UNAVAILABLE"),
    ShuttingDown: (503, "shutting_down", "UNAVAILABLE"),
    DeviceUnavailable: (503, "device_unavailable", "UNAVAILABLE"),
    RequestTimeout: (504, "timeout", "DEADLINE_EXCEEDED"),
}
_INTERNAL = (500, "internal", "INTERNAL")


def _row(err: ServeError) -> tuple[int, str, str]:
    for cls in type(err).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return _INTERNAL


def answer(err: ServeError) -> tuple[int, str]:
    """The HTTP status and error type for ``err`` (its class or nearest listed base)."""
    status, kind, _ = _row(err)
    return status, kind


def grpc_answer(err: ServeError) -> tuple[str, str]:
    """The gRPC status code name and error type for ``err`` (its class or nearest listed base)."""
    _, kind, code = _row(err)
    return code, kind
