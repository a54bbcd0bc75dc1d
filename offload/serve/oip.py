"""The Open Inference Protocol v2 (KServe / Triton) request and response bodies, JSON and binary.

Only what a scoring model needs: one FP32 input of shape ``[batch, features]``, one FP32 output of
shape ``[batch, n_out]``. The binary tensor extension (Triton's ``Inference-Header-Content-Length``)
is accepted both ways, since ``tritonclient.http`` uses it by default. Every malformed body raises
:class:`~offload.serve.errors.InvalidRequest` (400) with a message naming the field and the limit.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

import msgspec
import numpy as np
import orjson

from offload.serve.errors import InvalidRequest, RequestError
from offload.serve.json_rows import compiled as compiled_json_rows

__all__ = [
    "OipError", "TensorSpec", "InferRequest", "JsonRows", "parse_infer", "stack_rows", "LoneRows", "encode_infer", "encode_json",
    "json_row_values", "json_single_answers", "encode_json_rows", "check_shape", "as_fp32", "fp32_finite", "HEADER_LENGTH", "JSON_HEADERS",
]

HEADER_LENGTH = "inference-header-content-length"
# The extra headers of every JSON answer (results and errors alike): one shared, read-only mapping,
# so the server can send a prebuilt header list for it.
JSON_HEADERS: Mapping[str, str] = MappingProxyType({"content-type": "application/json"})
_FP32_MAX = float(np.finfo(np.float32).max)
_F32 = np.dtype(np.float32)
_F32_LE = np.dtype("<f4")  # the wire's FP32; _F32 itself on a little-endian host
_FP32_MAX_SQ = _FP32_MAX * _FP32_MAX
_SAFE_SQ = float(2**126)  # (2**63)**2, far inside FP32's range: see stack_rows
# The bytes +FP32_MAX and -FP32_MAX begin with (ff ff 7f, then 7f or ff): one search finds both.
_FP32_EXTREME_LE = np.float32(_FP32_MAX).tobytes()[:3]
assert np.float32(-_FP32_MAX).tobytes()[:3] == _FP32_EXTREME_LE
_SMALL = 256  # values in a batch up to which stack_rows checks them by their FP32 bytes, not BLAS


# The base of every refused request; ``status`` comes from the service's one table (errors.py).
OipError = RequestError


@dataclass(frozen=True)
class TensorSpec:
    """Name, datatype and per-row width of the model's input or output tensor."""

    name: str
    width: int
    datatype: str = "FP32"

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": [-1, self.width]}


class InferRequest(msgspec.Struct, frozen=True, gc=False):
    """A parsed request: the rows to score (float32, the FP32 values sent; or, where asked for,
    :class:`JsonRows` converted with their batch) and how to answer.
    A frozen msgspec Struct: made by one C call, where a NamedTuple's ``__new__`` is a Python frame
    (one per request; at one connection its code is cache lines each request brings back).
    gc=False: it holds rows, a string and flags, never itself."""

    x: np.ndarray | JsonRows
    id: str | None
    binary_output: bool
    # Every value of x is finite: JSON numbers that passed the FP32 range check always are (JSON
    # has no NaN or infinity); small binary tensors where fp32_finite proves it.
    finite: bool = False


def _obj(v: Any, what: str) -> dict:
    if not isinstance(v, dict):
        raise InvalidRequest(f"{what}: expected a JSON object, got {type(v).__name__}")
    return v


class JsonRows(msgspec.Struct, gc=False, eq=False):
    """A request's JSON rows, still the flat list of numbers the body held, converted together with
    the rest of its batch by :func:`stack_rows`: one NumPy conversion and one range check per batch
    instead of four fixed-cost NumPy calls per request (~1.4 us a request at 64 in flight). Only a
    flat list of ``n * f`` values whose first is a float is kept this way; its conversion, alone
    or with others, gives exactly what :func:`parse_infer` gives it eagerly, refusals included.
    A msgspec Struct, made by one C call (a class with ``__init__`` was a Python frame a request).
    gc=False: a list of numbers and two ints can hold no cycle. eq=False: equal only to itself,
    as the plain class was (a Struct would compare the lists)."""

    data: list
    n: int
    f: int

    def __len__(self) -> int:
        return self.n

    def convert(self) -> np.ndarray:
        """This request's rows alone (float32 [n, f]); :class:`InvalidRequest` as parse_infer."""
        return _json_data(self.data, self.n, self.f)


def parse_infer(body: bytes, header_length: str | None, inp: TensorSpec, out: TensorSpec, max_batch: int, *, lazy_json: bool = False) -> InferRequest:
    """Parses an OIP v2 ``infer`` body (JSON, or JSON header + binary tensors).

    ``lazy_json``: JSON rows may come back as :class:`JsonRows`, for :func:`stack_rows` to convert
    with the rest of their batch (the service's batcher does); otherwise ``x`` is always an array.
    """
    if header_length is None:
        # The common body without an id, its bytes read straight into the device's rows (C, see
        # offload.serve.json_rows; one C call a request once it is built: lru_cache's lookup).
        reader = compiled_json_rows()
        if reader is not None:
            x = reader(body, inp.name, inp.datatype, inp.width, max_batch)
            if x is not None:
                return InferRequest(x, None, False, True)
    if lazy_json and header_length is None:
        # The common body (see _COMMON), decoded here rather than in a function of its own: a
        # frame fewer on nearly every JSON request. Anything else is the general parser's.
        try:
            c = _COMMON.decode(body)
        except msgspec.DecodeError:  # ValidationError included: not the common body
            c = None
        if c is not None:
            t = c.inputs[0]
            b, f = t.shape
            if t.name == inp.name and t.datatype == inp.datatype and f == inp.width and 1 <= b <= max_batch and len(t.data) == b * f:
                return InferRequest(JsonRows(t.data, b, f), c.id, False, True)
    return _parse_general(body, header_length, inp, out, max_batch, lazy_json)


def _parse_general(body: bytes, header_length: str | None, inp: TensorSpec, out: TensorSpec, max_batch: int, lazy_json: bool) -> InferRequest:
    """:func:`parse_infer` for any body: the one that answers every body the common decode does not take."""
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
        req = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"malformed JSON: {e}") from None
    req = _obj(req, "request body")
    rid = req.get("id")
    if rid is not None and not isinstance(rid, str):
        raise InvalidRequest(f"id: expected a string, got {type(rid).__name__}")
    inputs = req.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1:
        raise InvalidRequest(f"inputs: expected a list of exactly 1 tensor named {inp.name!r}")
    t = _obj(inputs[0], "inputs[0]")
    if t.get("name") != inp.name:
        raise InvalidRequest(f"inputs[0].name: unknown input {t.get('name')!r}; the model's input is {inp.name!r}")
    if t.get("datatype") != inp.datatype:
        raise InvalidRequest(f"inputs[0].datatype: {t.get('datatype')!r} is not supported; expected {inp.datatype!r}")
    b, f = check_shape(t.get("shape"), inp, max_batch)
    if lazy_json and not binary:
        data = t.get("data")
        # The flat list of numbers every OIP client sends; a float first value keeps NumPy's
        # conversion of the whole list float64 however the batch around it looks (an int first
        # value could make it int64 or object alone, float64 in company).
        if type(data) is list and len(data) == b * f and type(data[0]) is float and "parameters" not in t:
            return InferRequest(JsonRows(data, b, f), rid, _wants_binary(req, out), True)
    x, finite = _tensor_data(t, binary, b, f)
    return InferRequest(x, rid, _wants_binary(req, out), finite)


class _CommonTensor(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    name: str
    datatype: str
    shape: tuple[int, int]
    data: list[float]


class _CommonBody(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    inputs: tuple[_CommonTensor]
    id: str | None = None


# The body nearly every JSON request is: {"inputs": [{"name", "datatype", "shape", "data"}]}, an
# optional "id" string beside it. msgspec decodes and type-checks it in one C pass, in about the
# instructions orjson.loads alone takes (callgrind: 10.8k against 10.5k for a 16-value row, and
# 22.6k for orjson plus _parse_general's checks); it is strict where the general parser refuses
# (no floats or booleans for ints, no booleans for floats, no other keys), and whatever it
# refuses goes the general way, which then gives its own answer. What it accepts the general
# parser accepts with the same values (ints in data become the same doubles either way).
# gc=False: neither can be part of a cycle (strings, ints, a list of floats), so the collector
# never has to walk them.
_COMMON = msgspec.json.Decoder(_CommonBody)


def check_shape(shape: Any, inp: TensorSpec, max_batch: int) -> tuple[int, int]:
    """``(batch, features)`` of an input shape, the same check for JSON and gRPC requests."""
    if not (isinstance(shape, list) and len(shape) == 2 and type(shape[0]) is int and type(shape[1]) is int):
        raise InvalidRequest(f"inputs[0].shape: expected [batch, {inp.width}], got {shape!r}")
    b, f = shape
    if f != inp.width:
        raise InvalidRequest(f"inputs[0].shape: {f} features per row; the model takes {inp.width}")
    if not 1 <= b <= max_batch:
        raise InvalidRequest(f"inputs[0].shape: batch {b} is outside [1, {max_batch}] (max batch size)")
    return b, f


def _tensor_data(t: dict, binary: bytes, b: int, f: int) -> tuple[np.ndarray, bool]:
    """The rows as float32 (the FP32 values sent, which is what the batcher stacks and the sim
    device reads), and whether they are known to be finite."""
    params = t.get("parameters") or {}
    params = _obj(params, "inputs[0].parameters")
    size = params.get("binary_data_size")
    if size is not None:
        if "data" in t:
            raise InvalidRequest("inputs[0]: has both 'data' and binary_data_size")
        if type(size) is not int or size != b * f * 4 or size != len(binary):
            raise InvalidRequest(f"inputs[0].parameters.binary_data_size: {size!r}; expected {b * f * 4} bytes (batch {b} x {f} FP32), body holds {len(binary)}")
        return fp32_rows(binary, b, f), fp32_finite(binary)
    if binary:
        raise InvalidRequest("binary data present but inputs[0] has no binary_data_size parameter")
    return _json_data(t.get("data"), b, f), True


def fp32_rows(data: bytes, b: int, f: int) -> np.ndarray:
    """``b`` rows of ``f`` little-endian FP32 values, ``data`` being their ``4 * b * f`` bytes
    (checked by the caller), as a writable array of their own: what :func:`stack_rows` hands the
    device as it is for a batch of one such request. One NumPy call (the constructor over a
    copy): ``frombuffer`` and ``reshape`` are two, on a read-only view the batch then had to
    copy, and at one connection each NumPy call runs cache-cold (round 8, BENCHMARKS.md)."""
    return np.ndarray((b, f), _F32_LE, bytearray(data))


def _finite_masks(n: int) -> tuple[int, int, int]:
    exp = one = sign = 0
    for i in range(0, 32 * n, 32):
        exp |= 0x7F800000 << i
        one |= 0x00800000 << i
        sign |= 0x80000000 << i
    return exp, one, sign


# fp32_finite's masks for every body it looks at: whole FP32 values, up to 256 bytes. Beyond that
# NumPy's reduction in the model's own check costs less than the integer arithmetic (warm, the
# reduction against the integers: 1.6 against 1.0 us at 256 bytes, 1.2 against 1.9 at 1 KiB). A
# lone request's row is 64 bytes.
_FINITE_MASKS = {4 * n: _finite_masks(n) for n in range(65)}


def fp32_finite(data: bytes) -> bool:
    """True when ``data``, little-endian FP32 values, holds no NaN or infinity; False when it
    does, and for data it does not look at: over 256 bytes, or not a whole number of values.

    A value is NaN or infinite exactly when its 8 exponent bits are all ones. Read as one integer,
    with only its exponent fields kept, ``data`` plus one at each field's lowest bit carries into
    a field's sign bit for such a value alone (a field's sum stays within its 32 bits). No NumPy
    call: for a lone request's row this is cheaper warm than the model's check (a reduction), and
    at one connection each NumPy call runs cache-cold (round 8, BENCHMARKS.md).

    Example::

        fp32_finite(np.float32([1.0, 3e38]).tobytes())     # True
        fp32_finite(np.float32([1.0, np.inf]).tobytes())   # False
    """
    masks = _FINITE_MASKS.get(len(data))
    if masks is None:
        return False
    exp, one, sign = masks
    return not ((int.from_bytes(data, "little") & exp) + one) & sign


def _json_data(data: Any, b: int, f: int) -> np.ndarray:
    if not isinstance(data, list):
        raise InvalidRequest("inputs[0].data: expected a list of numbers")
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError) as e:
        raise InvalidRequest(f"inputs[0].data: not a rectangular list of numbers ({e})") from None
    if arr.dtype.kind not in "iuf":
        raise InvalidRequest(f"inputs[0].data: expected numbers, got {'booleans' if arr.dtype.kind == 'b' else 'non-numeric values'}")
    if arr.size != b * f:
        raise InvalidRequest(f"inputs[0].data: {arr.size} values; shape [{b}, {f}] needs {b * f}")
    a = arr if arr.dtype.char == "d" else arr.astype(np.float64)
    if not _in_fp32_range(a):
        raise InvalidRequest(f"inputs[0].data: a value exceeds the FP32 range (|x| <= {_FP32_MAX:.6g})")
    return a.reshape(b, f).astype(np.float32)


def _in_fp32_range(a: np.ndarray) -> bool:
    # The range check in one reduction: the sum of squares stays below FP32_MAX**2 only when
    # every value does (BLAS's dot, which raises no overflow warning). Only a sum that gets
    # there pays for the exact test, which clears in-range values whose squares merely add up.
    return bool(np.vdot(a, a) < _FP32_MAX_SQ or np.abs(a).max() <= _FP32_MAX)


def stack_rows(xs: list[np.ndarray | JsonRows]) -> tuple[np.ndarray, dict[int, InvalidRequest]]:
    """A batch's rows as one float32 array (FP32, the wire type: every value sent is one, and
    the device's compiled path reads them as they are), in order, and the requests refused on the way.

    Arrays are the rows as given. :class:`JsonRows` are the FP32 values sent: all-JSON batches
    (the common case) are converted and range-checked in one go; a batch where that fails, or that
    mixes in arrays, converts each request on its own, so a refused request (``{index: error}``,
    left out of the array) takes no other request down with it.
    """
    x0 = xs[0]
    flat: list | None = None  # every request's values, when all are JsonRows (then only read)
    if len(xs) == 1:  # a lone request (every request at one connection): its own tests, first
        if type(x0) is JsonRows:
            flat = x0.data
        elif type(x0) is np.ndarray:
            # One request's own array (fp32_rows: binary REST, raw gRPC) that is already what the
            # device reads is the batch, with no copy; any other, a C-ordered float32 copy.
            flags = x0.flags
            if x0.dtype is _F32 and flags.writeable and flags.c_contiguous:
                return x0, {}
            return np.array(x0, dtype=_F32, order="C"), {}
    elif type(x0) is JsonRows:
        flat = []  # one pass both checks and joins (a generator for the check cost ~11 bytecodes a request)
        for x in xs:
            if type(x) is not JsonRows:
                flat = None
                break
            flat += x.data
    if flat is not None:
        n_rows = len(flat) // x0.f
        # struct reads Python numbers (floats, ints, bools) as C doubles or floats in one C loop,
        # ~80 machine instructions a value against ~330 for np.array's type discovery
        # (callgrind), and raises for anything else (a string, null, nested list). Its values are
        # the ones np.array reads (a double per number; an FP32 cast of it). What it takes is
        # only kept where every value is provably inside FP32's range: then the FP32 cast is the
        # one the general path makes. Otherwise NumPy's way below, with the exact check.
        if len(flat) <= _SMALL:
            # One row or a few: struct makes the FP32 cast itself and refuses (OverflowError)
            # every value whose cast overflows. The only ones past FP32_MAX it takes round to
            # +-FP32_MAX: a batch holding that bit pattern anywhere (misaligned matches too)
            # takes the exact way below, so no NumPy reduction or BLAS call for the rest. One
            # search for the three bytes both extremes begin with: it also sends values whose
            # mantissa is all ones (0.99999994, ...) and some straddling byte runs the exact way,
            # which gives them the same array; a second search cost ~0.5 us cold (round 19).
            # Packed into a bytearray: the array over it is writable, as the device's compiled
            # FP32 path wants (a read-only array is another numba type), with no NumPy copy.
            packed = bytearray(4 * len(flat))
            try:
                # The cache's lookup inline, _packer only on a miss: a frame fewer a lone request.
                (_STRUCTS.get((len(flat), "f")) or _packer(len(flat), "f")).pack_into(packed, 0, *flat)
            except (struct.error, OverflowError):  # not all numbers, or past FP32: see below
                packed = None
            # find(), not `in`: bytes.__contains__ first tries its argument as an integer, and
            # for bytes raises and formats a TypeError it then clears (CPython 3.11
            # Objects/bytes_methods.c, _Py_bytes_contains): ~2,300 machine instructions a test
            # (callgrind), where find() takes any buffer straight away.
            if packed is not None and packed.find(_FP32_EXTREME_LE) < 0:
                # The array made over the buffer in one constructor call: frombuffer and a reshape
                # are two calls, ~3x the time.
                return np.ndarray((n_rows, x0.f), _F32, packed), {}
        else:
            try:
                a = np.frombuffer(_packer(len(flat), "d").pack(*flat))
            except struct.error:  # not all numbers: see below
                a = None
            if a is not None and np.vdot(a, a) < _SAFE_SQ:  # every |x| < 2**63 < FP32_MAX
                return a.astype(np.float32).reshape(n_rows, x0.f), {}
        try:
            a = np.array(flat)
        except (ValueError, TypeError):  # a nested or ragged value: the per-request path names it
            a = None
        if a is not None and a.dtype.char == "d" and _in_fp32_range(a):
            return a.astype(np.float32).reshape(n_rows, x0.f), {}
    rows, refused = [], {}
    for i, x in enumerate(xs):
        if type(x) is JsonRows:
            try:
                x = x.convert()
            except InvalidRequest as e:
                refused[i] = e
                continue
        rows.append(x)
    return (np.concatenate(rows, axis=0, dtype=np.float32) if rows else np.empty((0, 0), dtype=np.float32)), refused


class LoneRows:
    """The rows of a request that the device computes alone, at once (the batcher's ``alone``):
    ``stack_rows([x])``'s array, or its refusal raised. A one-row JSON request of ``width``
    values that msgspec read (one with an id, or any where the compiled reader of
    :mod:`offload.serve.json_rows` could not be built; the reader's own arrays are submitted
    ``ready`` and skip this) is packed into one buffer kept for the next: the array is only read
    by the device call the batcher makes before it returns, and is overwritten by the next lone
    request. Any other request is ``stack_rows``'s own.

    A bytearray and an array over it, made once: per request those were a bytearray and NumPy's
    array constructor, ~2 us of a lone request in a real server (cold; BENCHMARKS.md, round 19).

    Example::

        alone = LoneRows(16)
        x = alone(JsonRows([0.5] * 16, 1, 16))   # float32 [1, 16], the same buffer every call
    """

    __slots__ = ("_width", "_buf", "_rows", "_pack")

    def __init__(self, width: int) -> None:
        self._width = width
        self._buf = bytearray(4 * width)
        self._rows = np.ndarray((1, width), _F32, self._buf)  # writable, aligned (the buffer is malloc'd)
        self._pack = struct.Struct(f"={width}f").pack_into

    def __call__(self, x: np.ndarray | JsonRows) -> np.ndarray:
        if type(x) is JsonRows and x.n == 1 and x.f == self._width:
            buf = self._buf
            try:
                self._pack(buf, 0, *x.data)  # as stack_rows packs a small batch: see there
            except (struct.error, OverflowError):
                pass
            else:
                if buf.find(_FP32_EXTREME_LE) < 0:
                    return self._rows
        rows, refused = stack_rows([x])
        if refused:
            raise refused[0]
        return rows


def _packer(n: int, code: str) -> struct.Struct:
    """The packer of ``n`` native doubles (``"d"``) or FP32 values (``"f"``), made once per length."""
    s = _STRUCTS.get((n, code))
    if s is None:
        if len(_STRUCTS) >= 1024:  # one per batch length seen; bounded all the same
            _STRUCTS.clear()
        s = _STRUCTS[(n, code)] = struct.Struct(f"={n}{code}")
    return s


_STRUCTS: dict[tuple[int, str], struct.Struct] = {}


def _wants_binary(req: dict, out: TensorSpec) -> bool:
    params = req.get("parameters") or {}
    if isinstance(params, dict) and params.get("binary_data_output") is True:
        return True
    outs = req.get("outputs")
    if outs is None:
        return False
    if not isinstance(outs, list):
        raise InvalidRequest("outputs: expected a list")
    binary = False
    for i, o in enumerate(outs):
        o = _obj(o, f"outputs[{i}]")
        if o.get("name") != out.name:
            raise InvalidRequest(f"outputs[{i}].name: unknown output {o.get('name')!r}; the model's output is {out.name!r}")
        p = o.get("parameters") or {}
        binary = binary or (isinstance(p, dict) and p.get("binary_data") is True)
    return binary


def encode_infer(model: str, version: str, req: InferRequest, y: np.ndarray, out: TensorSpec) -> tuple[bytes, dict[str, str]]:
    """The response body and its extra headers."""
    y32 = as_fp32(y)
    tensor: dict[str, Any] = {"name": out.name, "datatype": "FP32", "shape": list(y32.shape)}
    resp: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": [tensor]}
    if req.id is not None:
        resp["id"] = req.id
    if req.binary_output:
        raw = y32.astype("<f4", copy=False).tobytes()
        tensor["parameters"] = {"binary_data_size": len(raw)}
        head = orjson.dumps(resp)
        return head + raw, {"Inference-Header-Content-Length": str(len(head)), "content-type": "application/octet-stream"}
    tensor["data"] = y32.reshape(-1)
    return orjson.dumps(resp, option=orjson.OPT_SERIALIZE_NUMPY), {"content-type": "application/json"}


def encode_json(model: str, version: str, rid: str | None, y: np.ndarray, out: TensorSpec) -> bytes:
    """:func:`encode_infer`'s JSON body, byte for byte, from a cached head: everything before the
    values is the same for every response of a model with as many rows. ``y`` is [rows, width]."""
    y32 = as_fp32(y)
    # The rows in one call, their brackets then dropped ("[[a,b],[c,d]]" -> "a,b,c,d": numbers
    # hold no brackets): the flat list's text, without ravel's NumPy call (microseconds, cold).
    text = orjson.dumps(y32, option=orjson.OPT_SERIALIZE_NUMPY)
    # The head's cache and an id-less tail inline, their functions only on a miss and for an id:
    # two frames fewer on every lone JSON answer.
    head = _JSON_HEADS.get((model, version, out.name, y32.shape)) or _json_head(model, version, out, y32.shape)
    return head + b"[" + text[2:-2].replace(b"],[", b",") + b"]" + (_NO_ID_TAIL if rid is None else _json_tail(rid))


def json_row_values(y: np.ndarray) -> list[bytes]:
    """The JSON text of each row's FP32 values (``b"0.5,0.25"``), for a whole batch in one
    encoding: row ``i`` of a batch is the same text whichever request it answers."""
    text = orjson.dumps(as_fp32(y), option=orjson.OPT_SERIALIZE_NUMPY)
    return text[2:-2].split(b"],[")  # "[[a,b],[c,d]]": numbers hold no brackets


def as_fp32(y: np.ndarray) -> np.ndarray:
    """``y`` as C-ordered float32, FP32 the wire type: as it is when it is one already (the sim
    device's outputs are; a NumPy call costs microseconds when its code has left the caches, as
    at one connection), else converted. The runner's outputs pass through it, and every encoder's."""
    return y if y.dtype.char == "f" and y.flags.c_contiguous else np.ascontiguousarray(y, dtype=np.float32)


def json_single_answers(model: str, version: str, rows: list[bytes], out: TensorSpec) -> list[bytes]:
    """The id-less answer to each row alone, for a whole batch in one pass: item ``i`` is
    ``encode_json_rows(model, version, None, rows, i, 1, out)``, byte for byte. A batch of
    single-row requests (a scoring service's usual one) then costs each of them an index, where
    encoding its own answer was a call and ~40 bytecodes (round 18)."""
    pre = _json_head(model, version, out, (1, out.width)) + b"["  # once a batch: no inline lookup needed
    post = b"]" + _NO_ID_TAIL
    return [pre + r + post for r in rows]


def encode_json_rows(model: str, version: str, rid: str | None, rows: list[bytes], off: int, n: int, out: TensorSpec) -> bytes:
    """:func:`encode_json`'s body, byte for byte, for rows ``off:off + n`` of a batch whose
    :func:`json_row_values` are ``rows``."""
    data = b"[" + (rows[off] if n == 1 else b",".join(rows[off : off + n])) + b"]"
    shape = (n, out.width)
    head = _JSON_HEADS.get((model, version, out.name, shape)) or _json_head(model, version, out, shape)  # as encode_json's
    return head + data + (_NO_ID_TAIL if rid is None else _json_tail(rid))


def _json_head(model: str, version: str, out: TensorSpec, shape: tuple[int, int]) -> bytes:
    key = (model, version, out.name, shape)
    head = _JSON_HEADS.get(key)
    if head is None:
        if len(_JSON_HEADS) >= 1024:  # one entry per batch size seen; bounded all the same
            _JSON_HEADS.clear()
        t = {"name": out.name, "datatype": "FP32", "shape": list(shape), "data": None}
        whole = orjson.dumps({"model_name": model, "model_version": version, "outputs": [t]})
        head = _JSON_HEADS[key] = whole[: whole.rindex(b"null")]
    return head


def _json_tail(rid: str | None) -> bytes:
    return b'}],"id":' + orjson.dumps(rid) + b"}" if rid is not None else _NO_ID_TAIL


_NO_ID_TAIL = b"}]}"
_JSON_HEADS: dict[tuple, bytes] = {}
