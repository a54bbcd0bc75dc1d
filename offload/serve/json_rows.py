"""The common JSON infer body's rows in one compiled call (``_json_rows.cpp``), built with g++ at load.

At one connection every request is one JSON row, and reading it was the service's costliest
step: msgspec's decoder makes a Python float per value, a struct and a list, and ``stack_rows``
packs them back into FP32 (parse 3.8 us and rows 2.8 us of a lone request in a real server, each
a C library entered cold; BENCHMARKS.md, round 19). :func:`compiled` reads the body's bytes
straight into the float32 array the device takes, in one call; it takes only the common body
(``{"inputs": [{name, datatype, shape, data}]}``, no id), reads it as msgspec and ``stack_rows``
would, and gives None for every other body, which then goes the general way. The tests compare
the two on adversarial bodies and numbers.

Built by :func:`offload.hls.csim.build` (cached by the source's hash, the compiler and the
include paths: once per machine and Python) the first time a service is made. Where no compiler
or Python headers are found, :func:`compiled` returns None and the service parses as before.

Example::

    rows = compiled()
    x = rows(b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[0.5,1.0]}]}', "x", "FP32", 2, 64)
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import sysconfig
import time
from importlib import resources
from typing import Callable

import numpy as np

from offload.hls import csim
from offload.sim.errors import CSimError, ToolchainMissing

__all__ = ["compiled"]

_log = logging.getLogger("offload.serve")


@functools.lru_cache(maxsize=None)
def compiled() -> Callable[[bytes, str, str, int, int], np.ndarray | None] | None:
    """``rows(body, name, datatype, width, max_batch)``: the float32 [b, width] rows of a common
    infer body for an input called ``name`` of ``datatype``, or None for any other body; None
    itself where it cannot be built here (then it is logged once)."""
    src = resources.files("offload.serve").joinpath("_json_rows.cpp").read_bytes()
    include = sysconfig.get_paths()["include"]
    t0 = time.perf_counter()
    try:
        lib = csim.build({"_json_rows.cpp": src}, shared=True, include_dirs=(include, np.get_include()), flags=("-O2", "-std=c++17", "-fvisibility=hidden", "-w"))
    except (CSimError, ToolchainMissing, OSError) as e:
        _log.warning("the compiled JSON reader could not be built (%s); JSON bodies take msgspec's decoder", e)
        return None
    _log.info("compiled JSON reader ready in %.2f s (%s)", time.perf_counter() - t0, lib)
    spec = importlib.util.spec_from_file_location("_json_rows", lib)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.rows

