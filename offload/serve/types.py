"""The protocol-neutral request and response of the data plane: what REST JSON, REST binary and
gRPC all decode into and encode from (KServe's ``InferRequest`` / ``InferResponse`` in spirit).

Only what a scoring model needs: one FP32 input ``[batch, features]``, one FP32 output
``[batch, n_out]``. The codecs (``rest/codec.py``, ``grpc/codec.py``) build these; the data plane
(``dataplane.py``) never sees a wire format.

Example::

    req = InferRequest(fp32_rows(raw_bytes, 2, 16), id="r1")
    resp = await plane.infer(req)          # resp.y: float32 [2, n_out]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from offload.serve.errors import InvalidRequest

__all__ = ["TensorSpec", "InferRequest", "InferResponse", "check_input", "check_shape", "fp32_rows", "as_fp32"]

_F32_LE = np.dtype("<f4")


@dataclass(frozen=True)
class TensorSpec:
    """Name, datatype and per-row width of the model's input or output tensor."""

    name: str
    width: int
    datatype: str = "FP32"

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": [-1, self.width]}


@dataclass(frozen=True)
class InferRequest:
    """Rows to score (float32 ``[n, F]``, the FP32 values sent), the client's id, and whether the
    client asked for its output as raw bytes (REST's binary extension, gRPC's raw contents)."""

    rows: np.ndarray
    id: str | None = None
    binary_output: bool = False


@dataclass(frozen=True)
class InferResponse:
    """The answer to one :class:`InferRequest`: its own output rows (float32 ``[n, n_out]``)."""

    model: str
    version: str
    output: TensorSpec
    y: np.ndarray
    id: str | None = None
    binary_output: bool = False


def check_input(inputs: Any, inp: TensorSpec, max_batch: int) -> tuple[Any, int, int]:
    """The one input tensor of a request (anything with ``name``, ``datatype`` and ``shape``: a
    REST body's or a gRPC message's) and its ``(batch, features)``; the one check of both protocols."""
    if len(inputs) != 1:
        raise InvalidRequest(f"inputs: expected exactly 1 tensor named {inp.name!r}, got {len(inputs)}")
    t = inputs[0]
    if t.name != inp.name:
        raise InvalidRequest(f"inputs[0].name: unknown input {t.name!r}; the model's input is {inp.name!r}")
    if t.datatype != inp.datatype:
        raise InvalidRequest(f"inputs[0].datatype: {t.datatype!r} is not supported; expected {inp.datatype!r}")
    b, f = check_shape(list(t.shape), inp, max_batch)
    return t, b, f


def check_shape(shape: Any, inp: TensorSpec, max_batch: int) -> tuple[int, int]:
    """``(batch, features)`` of an input shape: the one check of REST and gRPC requests."""
    if not (isinstance(shape, (list, tuple)) and len(shape) == 2 and all(type(d) is int for d in shape)):
        raise InvalidRequest(f"inputs[0].shape: expected [batch, {inp.width}], got {list(shape) if isinstance(shape, tuple) else shape!r}")
    b, f = shape
    if f != inp.width:
        raise InvalidRequest(f"inputs[0].shape: {f} features per row; the model takes {inp.width}")
    if not 1 <= b <= max_batch:
        raise InvalidRequest(f"inputs[0].shape: batch {b} is outside [1, {max_batch}] (max batch size)")
    return b, f


def fp32_rows(data: bytes, b: int, f: int) -> np.ndarray:
    """``b`` rows of ``f`` little-endian FP32 values from exactly ``4 * b * f`` bytes (the caller
    checked the length), as a native float32 array of its own."""
    return np.frombuffer(data, dtype=_F32_LE).astype(np.float32).reshape(b, f)


def as_fp32(y: np.ndarray) -> np.ndarray:
    """``y`` as C-ordered float32, the wire type (as it is when it is one already)."""
    return y if y.dtype == np.float32 and y.flags.c_contiguous else np.ascontiguousarray(y, dtype=np.float32)
