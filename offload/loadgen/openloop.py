"""Open-loop load generator for OIP v2 ``infer`` endpoints.

Requests leave at a constant rate whatever the server does (no coordinated omission): request ``i``
is due at ``t0 + i / rate`` and its latency runs from that due time, so a stalled server or a
backed-up client shows up as latency rather than as fewer requests. Latencies go into an HDR
histogram (microseconds, 3 significant digits). Loopback targets only; count and time bounded.

Example::

    res = asyncio.run(run_load("http://127.0.0.1:8000/v2/models/risk", rate=500, duration=5))
    print(res.summary())
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import orjson
from hdrh.histogram import HdrHistogram

from offload.serve.server import is_loopback

__all__ = ["LoadResult", "run_load", "write_report", "MAX_DURATION_S", "MAX_REQUESTS"]

MAX_DURATION_S = 600.0
MAX_REQUESTS = 1_000_000
_MAX_LATENCY_US = 60_000_000  # a minute: beyond any request timeout
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


@dataclass
class LoadResult:
    """What one run measured; latencies in microseconds."""

    url: str
    rate: float
    duration: float
    batch: int
    sent: int
    ok: int
    errors: dict[str, int]
    elapsed: float
    hist: HdrHistogram = field(repr=False)

    @property
    def throughput(self) -> float:
        """Successful requests per second over the whole run, including the drain."""
        return self.ok / self.elapsed if self.elapsed > 0 else 0.0

    def percentiles(self) -> dict[str, float]:
        out = {f"p{p:g}": float(self.hist.get_value_at_percentile(p)) for p in PERCENTILES}
        out["max"] = float(self.hist.get_max_value())
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "rate": self.rate,
            "duration_s": self.duration,
            "batch": self.batch,
            "sent": self.sent,
            "ok": self.ok,
            "errors": dict(self.errors),
            "elapsed_s": self.elapsed,
            "throughput_rps": self.throughput,
            "latency_us": self.percentiles(),
            "hdr_histogram": self.hist.encode().decode() if self.ok else None,
        }

    def summary(self) -> str:
        p = self.percentiles()
        lat = "  ".join(f"{k}={v / 1e3:.3f}ms" for k, v in p.items())
        errs = sum(self.errors.values())
        detail = f" ({', '.join(f'{k}: {v}' for k, v in sorted(self.errors.items()))})" if errs else ""
        return f"{self.sent} requests at {self.rate:g}/s for {self.duration:g}s (batch {self.batch}): {self.ok} ok, {errs} errors{detail}\n  throughput {self.throughput:.1f} req/s\n  latency    {lat}"


def _endpoint(url: str, model: str | None) -> tuple[str, str]:
    """(base, model) from ``http://host:port/v2/models/NAME[/infer]`` or ``http://host:port`` + model."""
    u = urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"url {url!r}: expected http://HOST:PORT[/v2/models/NAME]")
    if not is_loopback(u.hostname):
        raise ValueError(f"url {url!r}: the load tool only targets loopback hosts (127.0.0.0/8, ::1, localhost)")
    parts = [p for p in u.path.split("/") if p]
    if parts[:2] == ["v2", "models"] and len(parts) >= 3:
        model = model or parts[2]
    if not model:
        raise ValueError(f"url {url!r}: name the model, as http://HOST:PORT/v2/models/NAME or with --model")
    return f"http://{u.netloc}", model


def _bodies(width: int, batch: int, n: int = 256, seed: int = 0) -> list[bytes]:
    # Pre-encoded, distinct request bodies: the send loop must not pay for JSON encoding.
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=(batch, width)).astype(np.float32)
        out.append(orjson.dumps({"inputs": [{"name": "x", "shape": [batch, width], "datatype": "FP32", "data": x.ravel().tolist()}]}))
    return out


async def run_load(
    url: str,
    rate: float,
    duration: float,
    *,
    batch: int = 1,
    model: str | None = None,
    timeout: float = 5.0,
    max_connections: int = 256,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """Sends ``rate * duration`` requests at a constant rate and measures each from its due time."""
    # aiohttp rather than httpx: at a few thousand requests per second the client's own CPU time
    # would otherwise dominate what is measured on a small machine.
    import aiohttp

    if not (rate > 0 and math.isfinite(rate)) or not (0 < duration <= MAX_DURATION_S):
        raise ValueError(f"rate={rate}, duration={duration}: need rate > 0 and 0 < duration <= {MAX_DURATION_S:g} s")
    n = int(round(rate * duration))
    if not 1 <= n <= MAX_REQUESTS:
        raise ValueError(f"rate x duration = {n} requests: must be in [1, {MAX_REQUESTS}]")
    if not 1 <= batch <= 4096:
        raise ValueError(f"batch={batch}: must be in [1, 4096]")
    base, model = _endpoint(url, model)
    hist = HdrHistogram(1, _MAX_LATENCY_US, 3)
    errors: dict[str, int] = {}
    ok = 0
    hdrs = {"content-type": "application/json", **(headers or {})}
    conn = aiohttp.TCPConnector(limit=max_connections)
    async with aiohttp.ClientSession(base, connector=conn, headers=hdrs, timeout=aiohttp.ClientTimeout(total=timeout)) as client:
        async with client.get(f"/v2/models/{model}") as meta:
            text = await meta.text()
            if meta.status != 200:
                raise RuntimeError(f"{base}/v2/models/{model}: HTTP {meta.status} {text[:200]}")
        width = int(orjson.loads(text)["inputs"][0]["shape"][-1])
        bodies = _bodies(width, batch)
        path = f"/v2/models/{model}/infer"

        async def one(i: int, due: float) -> None:
            nonlocal ok
            try:
                async with client.post(path, data=bodies[i % len(bodies)]) as r:
                    await r.read()
                    status = r.status
                if status == 200:
                    ok += 1
                    hist.record_value(max(1, min(_MAX_LATENCY_US, int((time.perf_counter() - due) * 1e6))))
                else:
                    errors[f"http_{status}"] = errors.get(f"http_{status}", 0) + 1
            except asyncio.TimeoutError:
                errors["timeout"] = errors.get("timeout", 0) + 1
            except aiohttp.ClientError as e:
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1

        tasks = []
        # A full collection in the middle of a run would stall every request due meanwhile (in a
        # process holding torch, ~100+ ms) and be charged to the server: objects alive now are
        # frozen out of collection, and the collector waits until the run is over.
        gc_was_enabled = gc.isenabled()
        gc.collect()
        gc.freeze()
        gc.disable()
        try:
            t0 = time.perf_counter() + 0.05
            for i in range(n):
                due = t0 + i / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(one(i, due)))
            await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - t0
        finally:
            gc.unfreeze()
            if gc_was_enabled:
                gc.enable()
    return LoadResult(url, rate, duration, batch, n, ok, errors, elapsed, hist)


def write_report(res: LoadResult, out_json: str | Path, out_png: str | Path | None = None) -> None:
    """Writes the JSON result and a latency-by-percentile plot (PNG)."""
    Path(out_json).write_text(json.dumps(res.to_json(), indent=2) + "\n")
    if out_png is None or not res.ok:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The usual HDR plot: x = 1 / (1 - percentile) on a log axis, so the tail gets the room.
    pct = np.array([50, 75, 90, 95, 99, 99.5, 99.9, 99.95, 99.99, 99.999])
    lat_ms = [res.hist.get_value_at_percentile(p) / 1e3 for p in pct]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(1 / (1 - pct / 100), lat_ms, marker="o")
    ax.set_xscale("log")
    ax.set_xticks(1 / (1 - pct / 100))
    ax.set_xticklabels([f"{p:g}%" for p in pct], rotation=45)
    ax.set_xlabel("percentile")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"{res.rate:g} req/s x {res.duration:g} s, batch {res.batch}: {res.throughput:.0f} req/s ok")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
