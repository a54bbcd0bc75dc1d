"""Service settings, one dataclass shared by the app, the CLI and the Ray deployment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ServeConfig"]


@dataclass(frozen=True)
class ServeConfig:
    """How the scoring service batches, guards and fails over.

    - ``max_batch_size``: rows per device call (also the largest batch one request may carry).
    - ``max_queue_delay_us``: how long the oldest queued request may wait for a fuller batch
      (Triton's ``max_queue_delay_microseconds``); 0 runs whatever is queued as soon as the device is free.
    - ``max_queue_size``: queued requests beyond this get 503 at once instead of an unbounded queue.
    - ``request_timeout_ms``: a request not answered by then gets 504 (and leaves the queue).
    - ``device_timeout_ms``: passed to ``Device.run``; a :class:`DeviceTimeout` counts as a device fault.
    - ``fallback``: on a device fault, ``"sim"`` re-runs the batch on the bit-exact sim device,
      ``"503"`` answers the affected requests with 503; either way the device reopens in the background.
    - ``api_key``: when set, every route but ``/v2/health/*`` needs ``Authorization: Bearer <key>``.
    - ``max_body_bytes``: larger request bodies get 413 before they are parsed.

    Example::

        cfg = ServeConfig(device="emu", max_batch_size=32, fallback="sim")
    """

    device: str = "sim"
    max_batch_size: int = 64
    max_queue_delay_us: int = 100
    max_queue_size: int = 1024
    request_timeout_ms: float = 1000.0
    device_timeout_ms: float = 1000.0
    fallback: Literal["sim", "503"] = "sim"
    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    reopen_backoff_s: float = 0.5

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch_size <= 65536:
            raise ValueError(f"max_batch_size={self.max_batch_size}: must be in [1, 65536]")
        if self.max_queue_delay_us < 0:
            raise ValueError(f"max_queue_delay_us={self.max_queue_delay_us}: must be >= 0")
        if self.max_queue_size < 1:
            raise ValueError(f"max_queue_size={self.max_queue_size}: must be >= 1")
        if self.request_timeout_ms <= 0 or self.device_timeout_ms <= 0:
            raise ValueError("request_timeout_ms and device_timeout_ms must be > 0")
        if self.fallback not in ("sim", "503"):
            raise ValueError(f"fallback={self.fallback!r}: must be 'sim' or '503'")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key: must not be empty (omit it to disable auth)")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes={self.max_body_bytes}: must be >= 1024")
