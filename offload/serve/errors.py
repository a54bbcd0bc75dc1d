"""The service's errors and the one table that says how each is answered over HTTP.

Every class is an :class:`offload.sim.errors.OffloadError`. A route never picks a status itself:
it raises one of these, and :func:`answer` looks the class up in :data:`HTTP_STATUS`, which also
gives the ``type`` label of ``offload_errors_total``. (Only the router's own 404/405 for paths and
methods no route has, and the 500 of an unexpected exception, come from elsewhere.)

Example::

    raise InvalidRequest("inputs[0].shape: expected [batch, 16], got [3]")
    status, kind = answer(err)          # (400, "bad_request")
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


# The one place a serve error becomes an HTTP status (and the ``type`` label of offload_errors_total).
HTTP_STATUS: dict[type[ServeError], tuple[int, str]] = {
    InvalidRequest: (400, "bad_request"),
    Unauthorized: (401, "unauthorized"),
    UnknownModel: (404, "unknown_model"),
    HeadTimeout: (408, "head_timeout"),
    BodyTooLarge: (413, "too_large"),
    UriTooLong: (414, "uri_too_long"),
    HeadTooLarge: (431, "head_too_large"),
    BadDeviceOutput: (500, "bad_output"),
    QueueFull: (503, "queue_full"),
    ShuttingDown: (503, "shutting_down"),
    DeviceUnavailable: (503, "device_unavailable"),
    RequestTimeout: (504, "timeout"),
}


def answer(err: ServeError) -> tuple[int, str]:
    """The HTTP status and error type for ``err`` (its class or nearest listed base)."""
    for cls in type(err).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500, "internal"
