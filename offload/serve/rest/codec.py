"""The Open Inference Protocol v2 REST bodies, JSON and binary, to and from the neutral types.

One decoder, msgspec: the body is decoded into typed structs in one pass, and every refusal is an
:class:`~offload.serve.errors.InvalidRequest` (400) naming the field. The binary tensor extension
(Triton's ``Inference-Header-Content-Length``) works both ways, since ``tritonclient.http`` uses it
by default. Clients that want the fastest path send binary tensors or use gRPC, as KServe advises.

Example::

    req = decode_infer(body, header_length, model.input, model.output, max_batch=64)
    body, headers = encode_infer(resp)
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from offload.serve.errors import InvalidRequest
from offload.serve.types import InferRequest, InferResponse, TensorSpec, as_fp32, check_input, fp32_rows

__all__ = ["decode_infer", "encode_infer", "encode_json", "HEADER_LENGTH"]

HEADER_LENGTH = "inference-header-content-length"
_FP32_MAX = float(np.finfo(np.float32).max)


class _Tensor(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]
    data: list | None = None
    parameters: dict[str, Any] | None = None


class _Output(msgspec.Struct):
    name: str
    parameters: dict[str, Any] | None = None


class _Body(msgspec.Struct):
    inputs: list[_Tensor]
    id: str | None = None
    outputs: list[_Output] | None = None
    parameters: dict[str, Any] | None = None


_DECODER = msgspec.json.Decoder(_Body)
_encode = msgspec.json.Encoder().encode


def decode_infer(body: bytes, header_length: str | None, inp: TensorSpec, out: TensorSpec, max_batch: int) -> InferRequest:
    """An OIP v2 ``infer`` body (JSON, or a JSON header followed by binary tensors) as an
    :class:`InferRequest`; :class:`InvalidRequest` naming the field for anything else."""
    binary = b""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise InvalidRequest(f"Inference-Header-Content-Length: {header_length!r} is not an integer") from None
        if not 0 < n <= len(body):
            raise InvalidRequest(f"Inference-Header-Content-Length: {n} is outside the body's {len(body)} bytes")
        body, binary = body[:n], body[n:]
    try:
        req = _DECODER.decode(body)
    except msgspec.ValidationError as e:  # well-formed JSON of the wrong shape: its text names the path
        raise InvalidRequest(f"request body: {e}") from None
    except msgspec.DecodeError as e:
        raise InvalidRequest(f"malformed JSON: {e}") from None
    t, b, f = check_input(req.inputs, inp, max_batch)
    size = (t.parameters or {}).get("binary_data_size")
    if size is not None:
        if t.data is not None:
            raise InvalidRequest("inputs[0]: has both 'data' and binary_data_size")
        if type(size) is not int or size != b * f * 4 or size != len(binary):
            raise InvalidRequest(f"inputs[0].parameters.binary_data_size: {size!r}; expected {b * f * 4} bytes (batch {b} x {f} FP32), body holds {len(binary)}")
        rows = fp32_rows(binary, b, f)
    elif binary:
        raise InvalidRequest("binary data present but inputs[0] has no binary_data_size parameter")
    else:
        rows = _json_rows(t.data, b, f)
    return InferRequest(rows, req.id, _wants_binary(req, out))


def _json_rows(data: list | None, b: int, f: int) -> np.ndarray:
    """The JSON values (flat or nested, row-major) as float32: each number's FP32 cast."""
    if data is None:
        raise InvalidRequest("inputs[0].data: expected a list of numbers")
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError) as e:
        raise InvalidRequest(f"inputs[0].data: not a rectangular list of numbers ({e})") from None
    if arr.dtype.kind not in "iuf":
        raise InvalidRequest(f"inputs[0].data: expected numbers, got {'booleans' if arr.dtype.kind == 'b' else 'non-numeric values'}")
    if arr.size != b * f:
        raise InvalidRequest(f"inputs[0].data: {arr.size} values; shape [{b}, {f}] needs {b * f}")
    a = arr.astype(np.float64)
    # The cast to FP32 would make an infinity of a value past its range: refuse it instead.
    if a.size and np.abs(a).max() > _FP32_MAX:
        raise InvalidRequest(f"inputs[0].data: a value exceeds the FP32 range (|x| <= {_FP32_MAX:.6g})")
    return a.reshape(b, f).astype(np.float32)


def _wants_binary(req: _Body, out: TensorSpec) -> bool:
    if (req.parameters or {}).get("binary_data_output") is True:
        return True
    binary = False
    for i, o in enumerate(req.outputs or ()):
        if o.name != out.name:
            raise InvalidRequest(f"outputs[{i}].name: unknown output {o.name!r}; the model's output is {out.name!r}")
        binary = binary or (o.parameters or {}).get("binary_data") is True
    return binary


def encode_json(obj: Any) -> bytes:
    """Any JSON answer of the service (metadata, errors), by the service's one JSON library."""
    return _encode(obj)


def encode_infer(resp: InferResponse) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers: JSON, or a JSON header and the raw FP32 rows."""
    y = as_fp32(resp.y)
    tensor: dict[str, Any] = {"name": resp.output.name, "datatype": "FP32", "shape": list(y.shape)}
    body: dict[str, Any] = {"model_name": resp.model, "model_version": resp.version, "outputs": [tensor]}
    if resp.id is not None:
        body["id"] = resp.id
    if resp.binary_output:
        raw = y.astype("<f4", copy=False).tobytes()
        tensor["parameters"] = {"binary_data_size": len(raw)}
        head = _encode(body)
        return head + raw, {"inference-header-content-length": str(len(head)), "content-type": "application/octet-stream"}
    tensor["data"] = y.ravel().tolist()
    return _encode(body), {"content-type": "application/json"}
