"""``offload serve`` with a misbehaving device, for the fault tests: registers the ``hostile``
device backend, then runs the real CLI (``python _hostile_serve.py serve BUNDLE --device hostile:PLAN``).

PLAN is a comma-separated list of what successive runs do, counted across every instance in the
process (a reopened device continues the plan; the reopen's probe is a run too), then ``ok``:

- ``ok``: the sim device's answer;
- ``stuck``: the call never returns, but the device honours its timeout the way the card backends
  do (``offload.host._buffered``: a ThreadPoolExecutor worker, ``DeviceTimeout``, and a ``close``
  that joins the stuck worker);
- ``hang``: the call ignores its timeout and blocks the caller forever;
- ``runtime`` / ``oserror``: the binding raises ``RuntimeError`` / ``OSError``;
- ``missing``: no output ``y``; ``rows``: one row too many; ``shape``: a column too many;
  ``flat``: ``y`` flattened to 1-d; ``nan``: a NaN in ``y``.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from offload.host import DeviceTimeout, register_device
from offload.host.sim import SimDevice

_NEVER = threading.Event()
_LOCK = threading.Lock()
_STEP = [0]


class HostileDevice(SimDevice):
    def __init__(self, spec: str) -> None:
        super().__init__("hostile")
        self.plan = spec.split(":", 1)[1].split(",") if ":" in spec else []
        self._runs: ThreadPoolExecutor | None = None

    def _next(self) -> str:
        with _LOCK:
            i = _STEP[0]
            _STEP[0] += 1
        return self.plan[i] if i < len(self.plan) else "ok"

    def bind_rows(self, handle, *, fp32=False):
        return None  # every call goes through run(), which this stand-in overrides

    def run(self, handle, inputs, timeout=None):
        what = self._next()
        if what == "stuck":
            if self._runs is None:
                self._runs = ThreadPoolExecutor(max_workers=1)
            try:
                return self._runs.submit(_NEVER.wait).result(timeout=timeout)
            except FutureTimeout:
                raise DeviceTimeout(f"run did not finish within {timeout:g} s on device 'hostile'") from None
        if what == "hang":
            _NEVER.wait()
        if what == "runtime":
            raise RuntimeError("hostile: XRT error: kernel run failed")
        if what == "oserror":
            raise OSError(5, "Input/output error")
        out = super().run(handle, inputs, timeout)
        y = out["y"]
        if what == "missing":
            return {}
        if what == "rows":
            return {"y": np.concatenate([y, y[:1]])}
        if what == "shape":
            return {"y": np.concatenate([y, y], axis=1)}
        if what == "flat":
            return {"y": y.ravel()}
        if what == "nan":
            y = y.copy()
            y[0, 0] = np.nan
            return {"y": y}
        return out

    def close(self) -> None:
        if self._runs is not None:
            self._runs.shutdown(wait=True)  # as the card backends do: waits for a stuck worker
        super().close()


register_device("hostile")(HostileDevice)

if __name__ == "__main__":
    from offload.cli import main

    main()
