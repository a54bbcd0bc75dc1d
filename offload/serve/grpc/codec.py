"""KServe's ``ModelInferRequest`` / ``ModelInferResponse`` to and from the neutral types.

Example::

    req = decode_infer(pb.ModelInferRequest.FromString(wire), model.input, model.output, max_batch=64)
    msg = encode_infer(resp)
"""

from __future__ import annotations

import numpy as np

from offload.serve.errors import InvalidRequest
from offload.serve.proto import grpc_predict_v2_pb2 as pb
from offload.serve.types import InferRequest, InferResponse, TensorSpec, as_fp32, check_input, fp32_rows

__all__ = ["decode_infer", "encode_infer"]

# Typed-contents fields other than fp32_contents: filled in an FP32 request they mean a wrong datatype.
_OTHER_CONTENTS = ("bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents", "fp64_contents", "bytes_contents")
_FP32_MAX = float(np.finfo(np.float32).max)


def decode_infer(req: pb.ModelInferRequest, inp: TensorSpec, out: TensorSpec, max_batch: int) -> InferRequest:
    """The rows of a ModelInferRequest (float32); ``binary_output`` when the input came as raw
    contents (the answer then uses raw output contents too)."""
    t, b, f = check_input(req.inputs, inp, max_batch)
    raw = req.raw_input_contents
    if raw:
        if len(raw) != 1:
            raise InvalidRequest(f"raw_input_contents: {len(raw)} entries for 1 input")
        if t.HasField("contents"):
            raise InvalidRequest("inputs[0]: has both contents and raw_input_contents")
        if len(raw[0]) != b * f * 4:
            raise InvalidRequest(f"raw_input_contents[0]: {len(raw[0])} bytes; shape [{b}, {f}] FP32 needs {b * f * 4}")
        rows = fp32_rows(raw[0], b, f)
    else:
        c = t.contents
        for name in _OTHER_CONTENTS:
            if len(getattr(c, name)):
                raise InvalidRequest(f"inputs[0].contents.{name}: the input is FP32; send fp32_contents or raw_input_contents")
        if len(c.fp32_contents) != b * f:
            raise InvalidRequest(f"inputs[0].contents.fp32_contents: {len(c.fp32_contents)} values; shape [{b}, {f}] needs {b * f}")
        rows = np.array(c.fp32_contents, dtype=np.float32).reshape(b, f)
    for i, o in enumerate(req.outputs):
        if o.name != out.name:
            raise InvalidRequest(f"outputs[{i}].name: unknown output {o.name!r}; the model's output is {out.name!r}")
    return InferRequest(rows, req.id or None, bool(raw))


def encode_infer(resp: InferResponse) -> pb.ModelInferResponse:
    """The ModelInferResponse of ``resp``: raw output contents when the request sent raw inputs."""
    y = as_fp32(resp.y)
    msg = pb.ModelInferResponse(model_name=resp.model, model_version=resp.version, id=resp.id or "")
    tensor = msg.outputs.add(name=resp.output.name, datatype="FP32", shape=y.shape)
    if resp.binary_output:
        msg.raw_output_contents.append(y.astype("<f4", copy=False).tobytes())
    else:
        tensor.contents.fp32_contents.extend(y.ravel().tolist())
    return msg
