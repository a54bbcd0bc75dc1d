"""The OIP v2 REST codec on its own, without a server: every refusal of ``decode_infer`` on both
sides of its limit, and ``encode_infer``'s JSON and binary answers as the KServe v2 protocol and
Triton's binary tensor extension define them (the bytes after the JSON header are the tensor's
little-endian FP32 values; ``Inference-Header-Content-Length`` is the JSON header's length)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from offload.serve.errors import InvalidRequest
from offload.serve.rest.codec import HEADER_LENGTH, decode_infer, encode_infer, encode_json
from offload.serve.types import InferResponse, TensorSpec

INP, OUT = TensorSpec("x", 3), TensorSpec("y", 1)
FP32_MAX = float(np.finfo(np.float32).max)  # IEEE 754 binary32's largest finite value


def _json(data, shape=(2, 3), **extra) -> bytes:
    t = {"name": "x", "datatype": "FP32", "shape": list(shape), "data": data}
    t.update(extra.pop("tensor", {}))
    return json.dumps({"inputs": [t], **extra}).encode()


def _binary(x: np.ndarray, size=None, **extra) -> tuple[bytes, str]:
    raw = x.astype("<f4").tobytes()
    t = {"name": "x", "datatype": "FP32", "shape": list(x.shape), "parameters": {"binary_data_size": len(raw) if size is None else size}}
    head = json.dumps({"inputs": [t], **extra}).encode()
    return head + raw, str(len(head))


def _refused(body, header=None, match=""):
    with pytest.raises(InvalidRequest, match=match):
        decode_infer(body, header, INP, OUT, max_batch=4)


def test_json_rows_are_each_numbers_fp32_cast_flat_or_nested():
    vals = [0.1, -2.5, 3, 16777217, 1e-46, 7.0]  # 2**24+1 and a subnormal: float32 rounding visible
    want = np.array(vals, dtype=np.float64).astype(np.float32).reshape(2, 3)
    for data in (vals, [vals[:3], vals[3:]]):
        req = decode_infer(_json(data, id="r7"), None, INP, OUT, max_batch=4)
        assert req.rows.dtype == np.float32 and req.rows.shape == (2, 3)
        np.testing.assert_array_equal(req.rows, want)
        assert req.id == "r7" and req.binary_output is False
    assert decode_infer(_json(vals), None, INP, OUT, max_batch=4).id is None


def test_the_fp32_range_is_accepted_to_its_last_value_and_refused_past_it():
    edge = [FP32_MAX, -FP32_MAX, 0.0, 1.0, 2.0, 3.0]
    np.testing.assert_array_equal(decode_infer(_json(edge), None, INP, OUT, 4).rows.ravel()[:2], [FP32_MAX, -FP32_MAX])
    past = np.nextafter(FP32_MAX, np.inf)  # the next double: FP32 would round it to infinity
    for bad in (past, -past):
        _refused(_json([bad, 0, 0, 0, 0, 0]), match="FP32 range")


@pytest.mark.parametrize("data, match", [
    (None, "expected a list of numbers"),
    ([[1, 2, 3], [4, 5]], "rectangular"),
    ([True, False, True, False, True, False], "booleans"),
    (["a", "b", "c", "d", "e", "f"], "non-numeric"),
    ([1, 2, 3, 4, 5], "5 values; shape \\[2, 3\\] needs 6"),
    ([1, 2, 3, 4, 5, 6, 7], "7 values"),
])
def test_json_data_refusals_name_the_field(data, match):
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3], **({} if data is None else {"data": data})}]}).encode()
    _refused(body, match=match)


def test_binary_rows_are_the_little_endian_bytes_after_the_header():
    x = np.array([[1.5, -0.0, 3e38], [np.float32(0.1), 2, -7]], dtype=np.float32)
    body, n = _binary(x, id="b1")
    req = decode_infer(body, n, INP, OUT, max_batch=4)
    assert req.rows.dtype == np.float32 and req.rows.tobytes() == x.tobytes() and req.id == "b1"


def test_header_length_is_accepted_from_1_to_the_body_length_and_refused_outside():
    body = _json([1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(decode_infer(body, str(len(body)), INP, OUT, 4).rows.ravel(), [1, 2, 3, 4, 5, 6])
    for n in ("0", "-1", str(len(body) + 1)):
        _refused(body, n, match="outside the body")
    _refused(body, "12a", match="not an integer")


def test_binary_data_size_must_be_an_int_equal_to_the_shape_and_to_the_bytes_sent():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for size in (23, 25, 24.0, True, "24"):
        body, n = _binary(x, size=size)
        _refused(body, n, match="binary_data_size: .*; expected 24 bytes \\(batch 2 x 3 FP32\\)")
    body, n = _binary(x, size=20)
    _refused(body[:-4], n, match="expected 24 bytes")  # size and bytes agree, but not with the shape
    body, n = _binary(x)
    _refused(body + b"\0\0\0\0", n, match="body holds 28")   # more bytes than the size says
    _refused(body[:-4], n, match="body holds 20")             # fewer
    head = _json([0, 1, 2, 3, 4, 5], tensor={"parameters": {"binary_data_size": 24}})
    _refused(head + x.tobytes(), str(len(head)), match="both 'data' and binary_data_size")
    plain = _json([0, 1, 2, 3, 4, 5])
    _refused(plain + x.tobytes(), str(len(plain)), match="no binary_data_size")


@pytest.mark.parametrize("body, match", [
    (b'{"inputs": [', "malformed JSON"),
    (b'{"inputs": 3}', "request body"),
    (b'{"inputs": []}', "exactly 1 tensor"),
    (json.dumps({"inputs": [json.loads(_json([1] * 6))["inputs"][0]] * 2}).encode(), "exactly 1 tensor"),
    (_json([1] * 6, tensor={"name": "z"}), "unknown input 'z'"),
    (_json([1] * 6, tensor={"datatype": "FP64"}), "'FP64' is not supported"),
    (_json([1] * 6, tensor={"datatype": "FP16"}), "'FP16' is not supported"),
    (_json([1] * 6, tensor={"datatype": "BF16"}), "'BF16' is not supported"),
    (_json([1] * 6, tensor={"datatype": "INT32"}), "'INT32' is not supported"),
    (_json([1] * 20, shape=(5, 4)), "4 features"),
    (_json([1] * 15, shape=(5, 3)), "batch 5 is outside \\[1, 4\\]"),
])
def test_body_refusals_name_the_field(body, match):
    _refused(body, match=match)


def test_binary_output_is_asked_by_the_request_parameter_or_any_output_entry():
    def wants(**extra):
        return decode_infer(_json([1] * 6, **extra), None, INP, OUT, 4).binary_output

    assert wants(parameters={"binary_data_output": True})
    assert not wants(parameters={"binary_data_output": "true"})  # only JSON true asks
    assert not wants(outputs=[{"name": "y"}])
    assert wants(outputs=[{"name": "y", "parameters": {"binary_data": True}}])
    assert wants(outputs=[{"name": "y", "parameters": {"binary_data": True}}, {"name": "y"}])
    assert wants(outputs=[{"name": "y"}, {"name": "y", "parameters": {"binary_data": True}}])
    assert not wants(outputs=[{"name": "y", "parameters": {"binary_data": 1}}])
    with pytest.raises(InvalidRequest, match=r"outputs\[1\].name: unknown output 'z'"):
        wants(outputs=[{"name": "y"}, {"name": "z"}])
    body, n = _binary(np.zeros((2, 3), np.float32))
    assert decode_infer(body, n, INP, OUT, 4).binary_output is False  # binary in, JSON out unless asked


def test_encode_json_answer():
    y = np.array([[0.25], [np.float32(0.1)]], dtype=np.float64)  # any dtype: sent as FP32
    body, headers = encode_infer(InferResponse("risk", "3", OUT, y, id="q"))
    assert headers == {"content-type": "application/json"}
    got = json.loads(body)
    assert got == {"model_name": "risk", "model_version": "3", "id": "q",
                   "outputs": [{"name": "y", "datatype": "FP32", "shape": [2, 1], "data": [0.25, float(np.float32(0.1))]}]}
    body, _ = encode_infer(InferResponse("risk", "3", OUT, y))
    assert "id" not in json.loads(body)
    assert json.loads(encode_json({"a": [1, "b"]})) == {"a": [1, "b"]}


def test_encode_binary_answer_is_a_json_header_then_the_fp32_bytes():
    y = np.array([[1.5], [-3.25], [np.float32(0.1)]], dtype=np.float32)
    body, headers = encode_infer(InferResponse("risk", "1", OUT, y, id=None, binary_output=True))
    n = int(headers[HEADER_LENGTH])
    assert headers["content-type"] == "application/octet-stream"
    head = json.loads(body[:n])
    assert head["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [3, 1], "parameters": {"binary_data_size": 12}}]
    assert "id" not in head
    np.testing.assert_array_equal(np.frombuffer(body[n:], dtype="<f4").reshape(3, 1), y)
    assert len(body) == n + 12
