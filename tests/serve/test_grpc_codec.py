"""KServe's gRPC ``ModelInferRequest`` / ``ModelInferResponse`` codec on its own, without a
server: each refusal on both sides of its limit, typed contents and raw contents (little-endian
FP32, as the KServe v2 protocol's ``raw_input_contents`` are), and the answer in the same form."""

from __future__ import annotations

import numpy as np
import pytest

from offload.serve.errors import InvalidRequest
from offload.serve.grpc.codec import decode_infer, encode_infer
from offload.serve.proto import grpc_predict_v2_pb2 as pb
from offload.serve.types import InferResponse, TensorSpec

INP, OUT = TensorSpec("x", 3), TensorSpec("y", 1)
X = np.array([[0.5, -1.25, 3e38], [np.float32(0.1), 2.0, -7.0]], dtype=np.float32)


def _req(x=X, raw=False, name="x", datatype="FP32", shape=None, id="", outputs=()):
    r = pb.ModelInferRequest(model_name="risk", id=id)
    t = r.inputs.add(name=name, datatype=datatype, shape=list(x.shape if shape is None else shape))
    if raw:
        r.raw_input_contents.append(x.astype("<f4").tobytes())
    else:
        t.contents.fp32_contents.extend(x.ravel().tolist())
    for o in outputs:
        r.outputs.add(name=o)
    return r


def _refused(req, match):
    with pytest.raises(InvalidRequest, match=match):
        decode_infer(req, INP, OUT, max_batch=4)


def test_typed_and_raw_contents_give_the_same_fp32_rows():
    for raw in (False, True):
        got = decode_infer(_req(raw=raw, id="g1", outputs=["y"]), INP, OUT, max_batch=4)
        assert got.rows.dtype == np.float32 and got.rows.tobytes() == X.tobytes()
        assert got.id == "g1" and got.binary_output is raw
    assert decode_infer(_req(), INP, OUT, 4).id is None  # proto3's empty string: no id


def test_request_refusals_name_the_field():
    two = _req()
    two.inputs.add(name="x", datatype="FP32", shape=[2, 3])
    _refused(two, "expected exactly 1 tensor named 'x', got 2")
    none = pb.ModelInferRequest(model_name="risk")
    _refused(none, "got 0")
    _refused(_req(name="z"), "unknown input 'z'")
    _refused(_req(name="a"), "unknown input 'a'")  # names sorting before the model's too
    _refused(_req(datatype="FP16"), "'FP16' is not supported")
    _refused(_req(x=np.zeros((5, 3), np.float32)), r"batch 5 is outside \[1, 4\]")
    decode_infer(_req(x=np.zeros((4, 3), np.float32)), INP, OUT, 4)  # the last batch accepted
    _refused(_req(outputs=["y", "w"]), r"outputs\[1\].name: unknown output 'w'")


def test_raw_contents_must_be_one_entry_of_exactly_the_shapes_bytes():
    r = _req(raw=True)
    r.raw_input_contents.append(b"\0" * 24)
    _refused(r, "2 entries for 1 input")
    for cut in (X.tobytes()[:-4], X.tobytes() + b"\0\0\0\0"):
        r = _req(raw=True)
        r.raw_input_contents[0] = cut
        _refused(r, f"{len(cut)} bytes; shape \\[2, 3\\] FP32 needs 24")
    both = _req(raw=True)
    both.inputs[0].contents.fp32_contents.append(1.0)
    _refused(both, "both contents and raw_input_contents")
    # contents present but empty still counts as "both": HasField, not the values
    empty = _req(raw=True)
    empty.inputs[0].contents.SetInParent()
    _refused(empty, "both contents and raw_input_contents")


@pytest.mark.parametrize("field, value", [
    ("bool_contents", True), ("int_contents", 1), ("int64_contents", 1), ("uint_contents", 1),
    ("uint64_contents", 1), ("fp64_contents", 1.0), ("bytes_contents", b"a"),
])
def test_other_typed_contents_mean_a_wrong_datatype(field, value):
    r = _req()
    getattr(r.inputs[0].contents, field).append(value)
    _refused(r, f"contents.{field}: the input is FP32")


def test_fp32_contents_count_must_match_the_shape():
    for n in (5, 7):
        r = _req()
        del r.inputs[0].contents.fp32_contents[:]
        r.inputs[0].contents.fp32_contents.extend([1.0] * n)
        _refused(r, f"{n} values; shape \\[2, 3\\] needs 6")


def test_the_answer_uses_raw_contents_exactly_when_asked():
    y = np.array([[1.5], [np.float32(0.1)]], dtype=np.float64)  # any dtype: sent as FP32
    msg = encode_infer(InferResponse("risk", "2", OUT, y, id="a", binary_output=False))
    assert (msg.model_name, msg.model_version, msg.id) == ("risk", "2", "a")
    (t,) = msg.outputs
    assert (t.name, t.datatype, list(t.shape)) == ("y", "FP32", [2, 1])
    assert list(t.contents.fp32_contents) == [1.5, float(np.float32(0.1))] and not msg.raw_output_contents
    msg = encode_infer(InferResponse("risk", "2", OUT, y, id=None, binary_output=True))
    assert msg.id == "" and not msg.outputs[0].contents.fp32_contents
    (raw,) = msg.raw_output_contents
    np.testing.assert_array_equal(np.frombuffer(raw, dtype="<f4"), y.astype(np.float32).ravel())
    assert list(msg.outputs[0].shape) == [2, 1]
