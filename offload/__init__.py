"""offload: move selected PyTorch operators onto Alveo FPGA cards.

The torch face lives here (custom ops, modules, partitioning, quantization), the service and the
CLI. Importing ``offload`` itself is cheap and torch-free: torch-facing names load on first use,
so ``offload.sim``, ``offload.kernels`` and ``offload.host`` work on machines without torch.

Example::

    import offload
    m = offload.nn.EmbeddingBag.from_float(torch_bag, fmt="ap_fixed<16,6>")
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> module that defines it; resolved lazily by __getattr__ (PEP 562).
_LAZY = {
    "nn": "offload.nn",
    "plan": "offload.plan",
    "save": "offload.host.bundle",
    "load": "offload.host.bundle",
    "offload": "offload.partition",
    "compare": "offload.partition",
    "advise": "offload.advisor",
    "OffloadError": "offload.sim.errors",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'offload' has no attribute {name!r}")
    m = importlib.import_module(mod)
    value = m if mod.endswith("." + name) else getattr(m, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
