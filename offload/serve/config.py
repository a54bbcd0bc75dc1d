"""Service settings, one dataclass shared by the app, the CLI and the Ray deployment."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from offload.hls.cards import LAUNCH_CHOICES
from offload.serve.errors import ConfigError

__all__ = ["ServeConfig"]


@dataclass(frozen=True)
class ServeConfig:
    """How the scoring service batches, guards and fails over.

    - ``max_batch_size``: rows per device call (also the largest batch one request may carry).
    - ``max_queue_delay_us``: how long the oldest queued request may wait for a fuller batch
      (Triton's ``max_queue_delay_microseconds``); 0 runs whatever is queued as soon as the device is free.
      A delay under 1 ms (the event loop's timer tick) arms no timer: a free device takes what the
      server has read by the next pass of the loop (offload/serve/batcher.py says why).
    - ``max_queue_size``: queued requests beyond this get 503 at once instead of an unbounded queue.
    - ``request_timeout_ms``: a request not answered by then gets 504 (and leaves the queue).
    - ``device_timeout_ms``: passed to ``Device.run``; a :class:`DeviceTimeout` counts as a device fault.
    - ``launch``: how the device starts the kernel: ``"per_call"`` (a run a batch),
      ``"persistent"`` (started once at load, batches through a ring in memory; refused at start-up
      by a device without it, with the reason) or ``"auto"``, persistent where the device offers it.
    - ``fallback``: on a device fault, ``"sim"`` re-runs the batch on the bit-exact sim device,
      ``"503"`` answers the affected requests with 503; either way the device reopens in the background.
    - ``api_key``: when set, every route but ``/v2/health/*`` needs ``Authorization: Bearer <key>``.
    - ``max_body_bytes``: larger request bodies get 413 before they are parsed.
    - ``max_head_bytes``: request line plus headers; larger heads get 431 (h11's default, 16 KiB).
    - ``header_timeout_s`` / ``body_timeout_s``: a request head (body) not fully received by then
      closes the connection (slowloris).
    - ``max_connections``: open connections before the longest-idle one waiting for a request head
      is closed to admit a new one; ``None`` derives it from the open-file limit.
    - ``grpc_max_streams``: concurrent streams per gRPC connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS),
      when a gRPC port is open (``offload serve --grpc-port``). Keep ``connections x streams``
      under ``max_queue_size`` for the clients you expect, so that a few connections that never
      read their answers cannot hold every RPC slot.
    - ``drain_timeout_s``: on SIGTERM, how long requests already read may take to be answered.

    Every setting is checked here; a bad one raises :class:`ConfigError` naming it and its range.

    Example::

        cfg = ServeConfig(device="emu", max_batch_size=32, fallback="sim")
    """

    device: str = "sim"
    max_batch_size: int = 64
    max_queue_delay_us: int = 100
    max_queue_size: int = 1024
    request_timeout_ms: float = 1000.0
    device_timeout_ms: float = 1000.0
    launch: Literal["auto", "per_call", "persistent"] = "auto"
    fallback: Literal["sim", "503"] = "sim"
    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    reopen_backoff_s: float = 0.5
    max_head_bytes: int = 16 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int | None = None
    drain_timeout_s: float = 30.0
    grpc_max_streams: int = 32

    def __post_init__(self) -> None:
        _int("max_batch_size", self.max_batch_size, 1, 65536)
        _int("max_queue_delay_us", self.max_queue_delay_us, 0, 10_000_000)
        _int("max_queue_size", self.max_queue_size, 1, 1_000_000)
        _seconds("request_timeout_ms", self.request_timeout_ms, 600_000)
        _seconds("device_timeout_ms", self.device_timeout_ms, 600_000)
        if self.launch not in LAUNCH_CHOICES:
            raise ConfigError(f"launch={self.launch!r}: must be 'auto', 'per_call' or 'persistent'")
        if self.fallback not in ("sim", "503"):
            raise ConfigError(f"fallback={self.fallback!r}: must be 'sim' or '503'")
        if self.api_key is not None and not self.api_key:
            raise ConfigError("api_key: must not be empty (omit it to disable auth)")
        _int("max_body_bytes", self.max_body_bytes, 1024, 1 << 30)
        _seconds("reopen_backoff_s", self.reopen_backoff_s, 60)
        _int("max_head_bytes", self.max_head_bytes, 1024, 1 << 20)
        _seconds("header_timeout_s", self.header_timeout_s, 3600)
        _seconds("body_timeout_s", self.body_timeout_s, 3600)
        if self.max_connections is not None:
            _int("max_connections", self.max_connections, 16, 1_000_000)
        _seconds("drain_timeout_s", self.drain_timeout_s, 3600)
        _int("grpc_max_streams", self.grpc_max_streams, 1, 65536)
        # Every request already read on SIGTERM is answered (result, 504 or 503) within the grace.
        if self.request_timeout_ms / 1e3 > self.drain_timeout_s:
            raise ConfigError(f"request_timeout_ms={self.request_timeout_ms:g}: must be <= drain_timeout_s ({self.drain_timeout_s:g} s), so a drain answers every request it has read")


def _int(name: str, v: object, lo: int, hi: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{name}={v!r}: must be an integer in [{lo}, {hi}]")
    if not lo <= v <= hi:
        raise ConfigError(f"{name}={v}: must be in [{lo}, {hi}]")


def _seconds(name: str, v: object, hi: float) -> None:
    """A duration: a finite number > 0 and <= ``hi`` (NaN compares false, so test finiteness first)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(f"{name}={v!r}: must be a finite number in (0, {hi:g}]")
    if not 0 < v <= hi:
        raise ConfigError(f"{name}={v:g}: must be in (0, {hi:g}]")
