"""C-simulation proof programs for :mod:`offload.sim.fixed`: run the same conversions through ap_types.

One generated C++ program holds a list of cases whose types are known at compile time (one
template instantiation each); Python streams inputs on stdin in case order and reads raw bit
patterns back. The program is built with :func:`offload.hls.csim.build`, so it is cached by
content hash and always uses hls4ml's headers.

Case kinds (``Case.op``):

- ``quantize`` ``(T,)``: ``T v = (double)x;`` -> raw bits of v and the bits of ``v.to_double()``
- ``cast`` ``(S, T)``: ``T t = s;`` for s given as raw bits of S
- ``add``/``sub``/``mul`` ``(A, B)``: ``auto r = a OP b;`` -> raw bits of r, plus r's width, I and sign
- ``acc`` ``(X, ACC)``: ``ACC acc = init; for k: acc += x[k];`` per row

Example::

    from offload.sim import FixedType, add_type, mul_type, sub_type
    from offload.hls.fixed_proof import Case, run_cases
    t = FixedType.parse("ap_fixed<8,3,AP_RND,AP_SAT>")
    (raw, back), = run_cases([Case("quantize", (t,))], [[0.3, -9.0]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from offload.sim import FixedType, add_type, mul_type, sub_type

from . import csim

__all__ = ["Case", "program_source", "build_program", "run_cases"]

_OPS = {"quantize": 1, "cast": 2, "add": 2, "sub": 2, "mul": 2, "acc": 2}

_PRELUDE = r"""
#include <cstdint>
#include <cstring>
#include <vector>
#include "ap_fixed.h"
#include "ap_int.h"
#include "offload_csim_io.h"
using namespace offload_csim;
static std::FILE *IN, *OUT;

template <class T> uint64_t bits_of(const T &v) { return v.range(T::width - 1, 0).to_uint64(); }
template <class T> void set_bits(T &v, uint64_t p) { v.range(T::width - 1, 0) = (unsigned long long)p; }

template <class T> void q_case() {
  uint64_t n = read_u64(IN);
  std::vector<double> d = read_array<double>(IN, n);
  std::vector<uint64_t> r(2 * n);
  for (uint64_t i = 0; i < n; i++) {
    T v = d[i];
    r[i] = bits_of(v);
    double back = v.to_double();
    std::memcpy(&r[n + i], &back, 8);
  }
  write_array(OUT, r.data(), r.size());
}

template <class S, class T> void c_case() {
  uint64_t n = read_u64(IN);
  std::vector<uint64_t> p = read_array<uint64_t>(IN, n);
  for (uint64_t i = 0; i < n; i++) {
    S s; set_bits(s, p[i]);
    T t = s;
    p[i] = bits_of(t);
  }
  write_array(OUT, p.data(), n);
}

template <class R, class = void> struct ap_iwidth { enum { value = R::width }; };
template <class R> struct ap_iwidth<R, decltype((void)R::iwidth)> { enum { value = R::iwidth }; };
template <class R> bool sign_of() { R t; set_bits(t, 1ULL << (R::width - 1)); return t < 0; }

#define ARITH_CASE(NAME, OP)                                                  \
template <class A, class B> void NAME() {                                     \
  uint64_t n = read_u64(IN);                                                  \
  std::vector<uint64_t> pa = read_array<uint64_t>(IN, n);                     \
  std::vector<uint64_t> pb = read_array<uint64_t>(IN, n);                     \
  A a; B b;                                                                   \
  typedef decltype(a OP b) R;                                                 \
  std::vector<uint64_t> r(n + 3);                                             \
  r[0] = R::width; r[1] = (uint64_t)(int64_t)ap_iwidth<R>::value; r[2] = sign_of<R>(); \
  for (uint64_t i = 0; i < n; i++) {                                          \
    set_bits(a, pa[i]); set_bits(b, pb[i]);                                   \
    R v = a OP b;                                                             \
    r[3 + i] = bits_of(v);                                                    \
  }                                                                           \
  write_array(OUT, r.data(), r.size());                                       \
}

ARITH_CASE(add_case, +)
ARITH_CASE(sub_case, -)
ARITH_CASE(mul_case, *)

template <class X, class ACC> void acc_case() {
  uint64_t n = read_u64(IN), k = read_u64(IN);
  std::vector<uint64_t> px = read_array<uint64_t>(IN, n * k);
  std::vector<uint64_t> pi = read_array<uint64_t>(IN, n);
  for (uint64_t i = 0; i < n; i++) {
    ACC acc; set_bits(acc, pi[i]);
    for (uint64_t j = 0; j < k; j++) {
      X x; set_bits(x, px[i * k + j]);
      acc += x;  // hls4ml: acc[i] += mult[j]  (== acc = acc + x)
    }
    pi[i] = bits_of(acc);
  }
  write_array(OUT, pi.data(), n);
}
"""

_FN = {"quantize": "q_case", "cast": "c_case", "add": "add_case", "sub": "sub_case", "mul": "mul_case", "acc": "acc_case"}


@dataclass(frozen=True)
class Case:
    """One operation on compile-time types; see the module docstring for ``op`` and ``types``."""

    op: str
    types: tuple[FixedType, ...]

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"Case.op must be one of {sorted(_OPS)}, got {self.op!r}")
        if len(self.types) != _OPS[self.op]:
            raise ValueError(f"Case {self.op!r} takes {_OPS[self.op]} types, got {len(self.types)}")
        for t in self.types:
            if t.width > 64:
                raise ValueError(f"Case types must be at most 64 bits wide, got {t}")
        if self.op in ("add", "sub", "mul"):
            rt = {"add": add_type, "sub": sub_type, "mul": mul_type}[self.op](*self.types)
            if rt.width > 64:
                raise ValueError(f"Case {self.op}: result type {rt} is wider than the 64 bits read back")


def program_source(cases: Sequence[Case]) -> str:
    """C++ text of one program running ``cases`` in order on stdin/stdout."""
    calls = [f"  {_FN[c.op]}<{', '.join(str(t) for t in c.types)} >();" for c in cases]
    return _PRELUDE + "\nint main() {\n  IN = stdin; OUT = stdout;\n" + "\n".join(calls) + "\n  return 0;\n}\n"


def build_program(cases: Sequence[Case]):
    """Compile (or fetch from cache) the program for ``cases``; returns the executable's path."""
    return csim.build({"fixed_proof.cpp": program_source(cases)}, flags=("-O0", "-std=c++14", "-w", "-DNDEBUG"))


def _pattern(raw: np.ndarray, t: FixedType) -> np.ndarray:
    r = np.asarray(raw)
    return (r.astype(np.int64).view(np.uint64) if r.dtype != np.uint64 else r) & np.uint64((1 << t.width) - 1 if t.width < 64 else (1 << 64) - 1)


def _raw(pattern: np.ndarray, t: FixedType) -> np.ndarray:
    """A W-bit pattern the C++ wrote -> raw values of ``t`` (sign-extended int64, or uint64 for a 64-bit
    unsigned type). Decoded here, not by offload.sim, whose conversions these programs check."""
    p = pattern.astype(np.uint64)
    if t.width == 64:
        return p.view(np.int64) if t.signed else p
    if not t.signed:
        return p.astype(np.int64)
    sign = np.uint64(1) << np.uint64(t.width - 1)
    return ((p ^ sign) - sign).view(np.int64)


def run_cases(cases: Sequence[Case], inputs: Sequence) -> list:
    """Run ``cases`` through ap_types; ``inputs[i]`` per case kind:

    quantize: doubles -> ``(raw, to_double)``; cast: src raws -> dst raws;
    add/sub/mul: ``(a_raw, b_raw)`` -> ``(raw, (width, integer, signed))``;
    acc: ``(x_raw[n, k], init_raw[n])`` -> acc raws.
    """
    if len(cases) != len(inputs):
        raise ValueError(f"{len(cases)} cases but {len(inputs)} inputs")
    exe = build_program(cases)
    chunks: list[bytes] = []
    for c, x in zip(cases, inputs):
        if c.op == "quantize":
            d = np.ascontiguousarray(x, dtype=np.float64).ravel()
            chunks += [np.uint64(d.size).tobytes(), d.tobytes()]
        elif c.op == "cast":
            p = _pattern(np.ravel(x), c.types[0])
            chunks += [np.uint64(p.size).tobytes(), p.tobytes()]
        elif c.op in ("add", "sub", "mul"):
            a, b = (np.ravel(v) for v in x)
            chunks += [np.uint64(a.size).tobytes(), _pattern(a, c.types[0]).tobytes(), _pattern(b, c.types[1]).tobytes()]
        else:
            xs, init = np.asarray(x[0]), np.ravel(x[1])
            n, k = xs.shape
            chunks += [np.array([n, k], np.uint64).tobytes(), _pattern(xs.ravel(), c.types[0]).tobytes(), _pattern(init, c.types[1]).tobytes()]
    out = np.frombuffer(csim.run(exe, input=b"".join(chunks)).stdout, dtype=np.uint64)
    results, pos = [], 0
    for c, x in zip(cases, inputs):
        if c.op == "quantize":
            n = np.size(x)
            raw = _raw(out[pos : pos + n], c.types[0])
            back = out[pos + n : pos + 2 * n].view(np.float64)
            results.append((raw, back))
            pos += 2 * n
        elif c.op == "cast":
            n = np.size(x)
            results.append(_raw(out[pos : pos + n], c.types[1]))
            pos += n
        elif c.op in ("add", "sub", "mul"):
            n = np.size(x[0])
            w, i, s = (int(v) for v in out[pos : pos + 3])
            i = i - (1 << 64) if i >= 1 << 63 else i
            rt = FixedType(w, i, bool(s))
            results.append((_raw(out[pos + 3 : pos + 3 + n], rt), (w, i, bool(s))))
            pos += 3 + n
        else:
            n = np.asarray(x[0]).shape[0]
            results.append(_raw(out[pos : pos + n], c.types[1]))
            pos += n
    if pos != out.size:
        raise csim.CSimError(f"fixed-point proof program wrote {out.size} words, expected {pos}")
    return results
