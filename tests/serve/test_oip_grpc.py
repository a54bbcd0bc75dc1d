"""The OIP v2 gRPC methods' own parsing and answers (offload/serve/oip_grpc.py), without a server:
how a request's repeated fields are read, and the raw answer's wire bytes, built from a cached
head. The live protocol (tritonclient, both transports) is tests/serve/test_grpc.py's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import _serve_standin as standin
from offload.serve.app import ScoringService
from offload.serve.config import ServeConfig
from offload.serve.errors import InvalidRequest
from offload.serve.oip import TensorSpec
from offload.serve.oip_grpc import OipGrpc, parse_grpc_infer
from offload.serve.proto import grpc_predict_v2_pb2 as pb

INP, OUT = TensorSpec("x", 16), TensorSpec("y", 1)


class _NoIter(list):
    """A repeated field that may be measured, indexed and sliced, but not iterated: iterating
    upb's containers goes by index until a formatted IndexError (see parse_grpc_infer)."""

    def __iter__(self):
        raise AssertionError("a repeated field was iterated")


def _message_like(x: np.ndarray, outputs: list[str], raw: bool) -> SimpleNamespace:
    """A ModelInferRequest as parse_grpc_infer reads it, every repeated field a _NoIter."""
    contents = SimpleNamespace(fp32_contents=_NoIter([] if raw else x.ravel().tolist()), **{n: _NoIter() for n in ("bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents", "fp64_contents", "bytes_contents")})
    t = SimpleNamespace(name="x", datatype="FP32", shape=_NoIter(x.shape), contents=contents, HasField=lambda name: name == "contents" and not raw)
    return SimpleNamespace(inputs=_NoIter([t]), raw_input_contents=_NoIter([x.tobytes()] if raw else []), outputs=_NoIter(SimpleNamespace(name=n) for n in outputs))


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "fp32_contents"])
def test_repeated_fields_are_read_by_index_or_slice(raw):
    x = np.random.default_rng(4).normal(size=(3, 16)).astype(np.float32)
    got, was_raw, finite = parse_grpc_infer(_message_like(x, ["y", "y"], raw), INP, OUT, 64)
    assert was_raw is raw and finite is raw  # typed contents are not looked at
    np.testing.assert_array_equal(got.view(np.uint32), x.view(np.uint32))
    # The same request as a real message reads the same.
    t = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[3, 16])
    if not raw:
        t.contents.fp32_contents.extend(x.ravel().tolist())
    req = pb.ModelInferRequest(inputs=[t], outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="y")] * 2, raw_input_contents=[x.tobytes()] if raw else [])
    again, _, _ = parse_grpc_infer(req, INP, OUT, 64)
    np.testing.assert_array_equal(again.view(np.uint32), x.view(np.uint32))
    # A wrong output further down the list is still found, and named by its index.
    with pytest.raises(InvalidRequest, match=r"outputs\[1\]\.name: unknown output 'z'"):
        parse_grpc_infer(_message_like(x, ["y", "z"], raw), INP, OUT, 64)


@pytest.fixture(scope="module")
def oip():
    from offload.host.bundle import load

    return OipGrpc(ScoringService(load(standin.risk_bundle_path()), ServeConfig(device="sim")))


def test_a_raw_answer_reads_as_the_whole_message_serialized_once(oip):
    rng = np.random.default_rng(9)
    # Batch sizes in an order that reuses a cached head after another size's; ids empty, short,
    # and long enough (multi-byte UTF-8, 320 bytes) for a two-byte length.
    for n, rid in [(1, ""), (3, "req-7"), (1, "é" * 160), (64, "x"), (3, "")]:
        y = rng.normal(size=(n, 1)).astype(np.float32)
        wire = oip.raw_answer(rid, y)
        out = pb.ModelInferResponse.InferOutputTensor(name="y", datatype="FP32", shape=[n, 1])
        want = pb.ModelInferResponse(model_name="risk", model_version="1", id=rid, outputs=[out], raw_output_contents=[y.tobytes()])
        got = pb.ModelInferResponse.FromString(wire)
        assert got == want, (n, rid)
        # What a client reads back: the rows bit for bit, the shape its own.
        assert list(got.outputs[0].shape) == [n, 1] and got.raw_output_contents[0] == y.tobytes()
