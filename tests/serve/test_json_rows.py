"""The compiled JSON reader (offload.serve.json_rows) against msgspec's parse of the same body.

Whatever body the reader takes, its rows must be, byte for byte, the rows parse_infer gives
without it (msgspec's decoder, then the FP32 cast): the same doubles from the same decimal text,
the same sign of zero, the same FP32 rounding. Whatever it cannot read that way it must leave
(None), and parse_infer then answers as before, refusals included.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import offload.serve.oip as oip
from offload.serve import json_rows
from offload.serve.errors import InvalidRequest
from offload.serve.oip import InferRequest, TensorSpec, parse_infer

F = 4
INP, OUT = TensorSpec("x", F), TensorSpec("y", 1)
MAX_BATCH = 8

reader = json_rows.compiled()
pytestmark = pytest.mark.skipif(reader is None, reason="the compiled JSON reader could not be built here (no g++ or Python headers)")


def _msgspec(body: bytes, inp: TensorSpec = INP) -> InferRequest | str:
    """parse_infer's answer without the reader: the request, or its refusal's message."""
    saved = oip.compiled_json_rows
    oip.compiled_json_rows = lambda: None
    try:
        return parse_infer(body, None, inp, OUT, MAX_BATCH)
    except InvalidRequest as e:
        return str(e)
    finally:
        oip.compiled_json_rows = saved


def _same(body: bytes, inp: TensorSpec = INP) -> bool:
    """The reader's rows for ``body`` are msgspec's, or the reader leaves it; True if it took it."""
    x = reader(body, inp.name, inp.datatype, inp.width, MAX_BATCH)
    if x is None:
        return False
    want = _msgspec(body, inp)
    assert isinstance(want, InferRequest), f"the reader took a body parse_infer refuses ({want}): {body!r}"
    assert want.id is None and not want.binary_output
    assert x.dtype == np.float32 and x.flags.carray and x.flags.owndata and x.shape == want.x.shape
    assert x.tobytes() == np.asarray(want.x, dtype=np.float32).tobytes(), body  # -0.0 and 0.0 differ here
    # parse_infer itself takes the reader's rows: finite, no id, JSON answers.
    got = parse_infer(body, None, inp, OUT, MAX_BATCH, lazy_json=True)
    assert type(got.x) is np.ndarray and got.finite and got.id is None and not got.binary_output
    assert got.x.tobytes() == x.tobytes()
    return True


def _body(tokens: list[str], rows: int = 1, **extra) -> bytes:
    t = {"name": "x", "datatype": "FP32", "shape": [rows, len(tokens) // rows], "data": "@"}
    t.update(extra)
    return json.dumps({"inputs": [t]}).replace('"@"', "[" + ", ".join(tokens) + "]").encode()


def _pad(tok: str) -> list[str]:
    return [tok, "0.5", "-1.25", "3"]


# ------------------------------------------------------------------------------------- numbers
_FP32_MAX = float(np.finfo(np.float32).max)
_HARD = [
    # Doubles msgspec and strtod alike must round correctly: halfway cases, 2**53 + 1, the
    # smallest normal, long expansions of exact binary fractions, denormals.
    "9007199254740993", "9007199254740993.0", "2.2250738585072011e-308", "2.2250738585072014e-308",
    "0.500000000000000166533453693773481063544750213623046875", "0.1000000000000000055511151231257827021181583404541015625",
    "1e-310", "4.9406564584124654e-324", "1e-400", "1e400", "-1e400", "1.7976931348623157e308", "1.7976931348623159e308",
    # FP32: its maximum, the first double that rounds past it (refused by the exact path), the
    # largest double that rounds down to it, ties between adjacent FP32 values.
    repr(_FP32_MAX), "3.4028235e38", "3.4028236e38", "3.40282356779733661637539395458142568448e38", "3.4028235677973366e38",
    repr(float(np.float32(1.0)) + 2.0**-24), repr(1.0 + 2.0**-24 + 2.0**-60), repr(1.0 + 3 * 2.0**-24), "1.00000005960464477539062500",
    "-0", "-0.0", "0", "0e0", "-0e-5", "1E5", "1e+5", "1e-5", "123456789012345", "1234567890123456", "-999999999999999",
    "1.5e-45", "7e-46", "-7.00649232162408535461864791644958065640130970938257885878534141944895541342930300743319094181060791015625E-46",
]


@pytest.mark.parametrize("tok", _HARD)
def test_hard_numbers_are_read_as_msgspec_reads_them_or_left(tok):
    body = _body(_pad(tok))
    taken = _same(body)
    if tok in ("1e400", "-1e400", "1.7976931348623159e308", "3.4028236e38", repr(_FP32_MAX), "3.4028235e38"):
        assert not taken  # past FP32, or its extreme: the exact range check decides
    if tok in ("9007199254740993.0", "123456789012345", "-0", "1E5", "0.500000000000000166533453693773481063544750213623046875"):
        assert taken
    if tok in ("9007199254740993", "1234567890123456"):
        assert not taken  # integers past 15 digits: msgspec reads them as ints first


def test_random_doubles_and_fp32_values_are_read_as_msgspec_reads_them():
    rng = np.random.default_rng(5)
    doubles = rng.normal(size=400) * 10.0 ** rng.integers(-40, 39, size=400)
    f32 = rng.normal(size=400).astype(np.float32).astype(np.float64)  # what OIP clients send: repr of an FP32
    ties = (np.float32(rng.normal(size=200)).astype(np.float64) + np.spacing(np.float32(rng.normal(size=200))).astype(np.float64) / 2)
    taken = 0
    for vals in (doubles, f32, ties):
        for i in range(0, len(vals) - F + 1, F):
            taken += _same(_body([repr(float(v)) for v in vals[i : i + F]]))
    assert taken >= 200


# A JSON number (RFC 8259, section 6), and text that is almost one.
_NUMBER = r"-?(0|[1-9][0-9]{0,20})(\.[0-9]{1,25})?([eE][+-]?[0-9]{1,3})?"


@settings(max_examples=400, deadline=None)
@given(st.from_regex(_NUMBER, fullmatch=True))
def test_any_json_number_is_read_as_msgspec_reads_it_or_left(tok):
    _same(_body(_pad(tok)))


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[-+]?[0-9.eE+-]{1,12}|[-+]?(inf|nan|Infinity|NaN|0x1p3)", fullmatch=True))
def test_text_that_is_not_a_json_number_is_left_or_read_as_msgspec_reads_it(tok):
    _same(_body(_pad(tok)))


@pytest.mark.parametrize("tok", ["01", "1.", ".5", "+1", "1e", "1e+", "-", "--1", "0x10", "inf", "NaN", "1_0", "１"])
def test_numbers_json_does_not_allow_are_left(tok):
    assert reader(_body(_pad(tok)), "x", "FP32", F, MAX_BATCH) is None


# ----------------------------------------------------------------------------------- structure
def _valid(rows: int = 2) -> bytes:
    return _body([repr(0.25 * i - 1.0) for i in range(rows * F)], rows)


def test_the_common_body_in_any_key_order_and_spacing_is_taken():
    tensor = {"name": "x", "datatype": "FP32", "shape": [2, F], "data": [0.5 * i for i in range(2 * F)]}
    keys = list(tensor)
    rng = np.random.default_rng(3)
    for _ in range(20):
        order = [keys[i] for i in rng.permutation(len(keys))]
        t = {k: tensor[k] for k in order}
        for dumps in (lambda o: json.dumps(o), lambda o: json.dumps(o, separators=(",", ":")), lambda o: json.dumps(o, indent="\t"), lambda o: " \r\n" + json.dumps(o, indent=3) + "\n\n"):
            assert _same(dumps({"inputs": [t]}).encode())


@pytest.mark.parametrize(
    "body",
    [
        # what msgspec takes, or parse_infer answers, and the reader leaves to them
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}],"id":"a"}',
        b'{"id":null,"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}',
        b'{"inputs":[{"name":"\\u0078","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4],"parameters":{}}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}],"outputs":[{"name":"y"}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}],"parameters":{"binary_data_output":true}}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[[1,2,3,4]]}]}',
        # and what parse_infer refuses
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,5],"data":[1,2,3,4,5]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[0,4],"data":[]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[9,4],"data":[' + b",".join([b"1"] * 36) + b"]}]}",
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[01,4],"data":[1,2,3,4]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1.0,4],"data":[1,2,3,4]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[-1,4],"data":[1,2,3,4]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4,1],"data":[1,2,3,4]}]}',
        b'{"inputs":[{"name":"y","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP64","shape":[1,4],"data":[1,2,3,4]}]}',
        b'{"inputs":[{"name":"x","name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4],"data":[1,2,3,4]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}],"inputs":[]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]},{"name":"x"}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4,]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}],}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,true]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,null]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,"4"]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]} x',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}{}',
        b'\xef\xbb\xbf{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}',
        b'{"inputs":[{"name":"x\xff","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}\x00',
        b'{"inputs":{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}}',
        b'{}', b'[]', b'', b'null', b'{"inputs":[]}',
    ],
)
def test_every_other_body_is_left_to_msgspec(body):
    assert reader(body, "x", "FP32", F, MAX_BATCH) is None
    # parse_infer answers it as it did without the reader
    want = _msgspec(body)
    try:
        got = parse_infer(body, None, INP, OUT, MAX_BATCH)
    except InvalidRequest as e:
        assert str(e) == want
    else:
        assert isinstance(want, InferRequest) and got.id == want.id and got.binary_output == want.binary_output
        np.testing.assert_array_equal(np.asarray(got.x), np.asarray(want.x))


def test_every_prefix_and_every_byte_mutation_is_left_or_read_as_msgspec_reads_it():
    body = _valid()
    for i in range(len(body)):
        assert reader(body[:i], "x", "FP32", F, MAX_BATCH) is None
    rng = np.random.default_rng(9)
    alphabet = b' \t\n\r{}[],:"\\-+.eE0123456789xFP32abnulltrue\x00\xff'
    taken = 0
    for _ in range(3000):
        b = bytearray(body)
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(len(b)))
            op = rng.integers(3)
            if op == 0:
                b[i] = alphabet[int(rng.integers(len(alphabet)))]
            elif op == 1:
                del b[i]
            else:
                b.insert(i, alphabet[int(rng.integers(len(alphabet)))])
        taken += _same(bytes(b))
    assert taken > 100  # mutations of digits and spacing still read, and match


def test_batches_up_to_the_limit_and_wide_rows_are_read():
    for rows in (1, 3, MAX_BATCH):
        assert _same(_valid(rows))
    wide = TensorSpec("features", 300)
    rng = np.random.default_rng(1)
    vals = [repr(float(v)) for v in rng.normal(size=2 * 300).astype(np.float32)]
    body = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 300], "data": "@"}]}).replace('"@"', "[" + ",".join(vals) + "]").encode()
    assert _same(body, wide)


def test_other_buffers_are_left_and_bad_arguments_raise():
    body = _valid()
    assert reader(bytearray(body), "x", "FP32", F, MAX_BATCH) is None
    assert reader(memoryview(body), "x", "FP32", F, MAX_BATCH) is None
    with pytest.raises(TypeError):
        reader(body, "x", "FP32", F)
    with pytest.raises(ValueError, match="width and max_batch"):
        reader(body, "x", "FP32", 0, MAX_BATCH)
    with pytest.raises(ValueError, match="width and max_batch"):
        reader(body, "x", "FP32", F, 2**21)


def test_each_call_gets_an_array_of_its_own():
    a = reader(_valid(), "x", "FP32", F, MAX_BATCH)
    b = reader(_body(["1", "2", "3", "4"]), "x", "FP32", F, MAX_BATCH)
    assert a is not b and not np.shares_memory(a, b)
    assert a.tobytes() == np.array([0.25 * i - 1.0 for i in range(2 * F)], np.float32).tobytes()
    assert b.tobytes() == struct.pack("4f", 1, 2, 3, 4)


def test_without_a_compiler_there_is_no_reader_and_parse_infer_answers_as_before(monkeypatch, tmp_path):
    from offload.hls import csim

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("OFFLOAD_CACHE_DIR", str(tmp_path))  # nothing cached: it must build
    csim._compiler.cache_clear()
    json_rows.compiled.cache_clear()
    try:
        assert json_rows.compiled() is None
        req = parse_infer(_valid(), None, INP, OUT, MAX_BATCH, lazy_json=True)
        assert type(req.x) is oip.JsonRows  # msgspec's way
    finally:
        csim._compiler.cache_clear()
        json_rows.compiled.cache_clear()
    monkeypatch.undo()
    assert json_rows.compiled() is not None
