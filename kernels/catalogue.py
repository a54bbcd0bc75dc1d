"""The catalogue of kernel configurations that the HLS regression suite exercises, and their golden vectors.

Each :class:`Entry` has a stable name (``emb/sum/ap_fixed16_6/d16/bag20/t1``,
``mlp/64-32-1/ap_fixed16_6/r1/relu``), a seed, and builds a :class:`Case`: a ``Kernel`` (spec and
resident tensors, deterministic from the seed) plus golden inputs. Together the entries cover what
the generators can produce: embedding formats (ap_fixed with saturating / wrapping accumulators,
``int8_rowwise``) x pooling modes x dims x bag-size profiles x single/multi-table, and MLP
architectures x precisions x reuse factors x activations. Specs come from the kinds' own
constructors; nothing here re-implements a kernel.

Golden vectors live in ``kernels/golden/``: one ``.npz`` per entry (resident tensors ``t.*``,
inputs ``i.*``, expected raw outputs ``o.*``; loaded with ``allow_pickle=False``) and
``index.json`` (kind, seed, spec JSON, shapes). They are written only by
``offload regress --regenerate`` (or ``scripts/make_golden.py``), which prints what changed.

Example::

    from offload.kernels.catalogue import entries, load_golden
    for e in entries("emb/sum/*"):
        g = load_golden(e.name)
        kernel, inputs, expected = g.kernel(), g.inputs, g.outputs
"""

from __future__ import annotations

import fnmatch
import io
import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from offload.kernels import embedding as emb
from offload.kernels.mlp import MlpSpec
from offload.kernels.registry import Kernel, get_kind
from offload.sim.errors import GoldenError  # noqa: F401  (re-exported: defined once in the hierarchy)
from offload.sim.fixed import FixedType
from offload.sim.mlp import MlpLayer
from offload.sim.mlp.strategy import DA, LATENCY

__all__ = [
    "Entry",
    "Case",
    "Golden",
    "GoldenError",
    "catalogue",
    "entries",
    "select",
    "golden_dir",
    "golden_path",
    "read_index",
    "load_golden",
    "write_golden",
    "diff_golden",
]

Builder = Callable[["Entry", np.random.Generator], "Case"]


@dataclass(frozen=True)
class Case:
    """A built catalogue entry: the kernel and one batch of golden inputs."""

    kernel: Kernel
    inputs: dict[str, np.ndarray]


@dataclass(frozen=True)
class Entry:
    """One catalogue configuration. ``params`` is a JSON-able description used by its builder."""

    name: str
    kind: str
    params: Mapping[str, Any]
    builder: Builder = field(repr=False, compare=False)
    seed: int = -1

    def __post_init__(self) -> None:
        if self.seed < 0:  # stable per name, independent of catalogue order
            object.__setattr__(self, "seed", zlib.crc32(self.name.encode()))

    def build(self) -> Case:
        """The kernel and golden inputs, deterministic from ``seed``."""
        return self.builder(self, np.random.default_rng(self.seed))


# ---------------------------------------------------------------- the catalogue


def _build_all() -> list[Entry]:
    return [*_embedding_entries(), *_mlp_entries()]


_CACHE: list[Entry] | None = None


def catalogue() -> list[Entry]:
    """Every entry, in a stable order (names are unique)."""
    global _CACHE
    if _CACHE is None:
        out = _build_all()
        names = [e.name for e in out]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"catalogue: duplicate entry names {sorted(dup)}")
        _CACHE = out
    return list(_CACHE)


def select(items: Iterable[Entry], patterns: Iterable[str] | str | None) -> list[Entry]:
    """Entries whose name matches any pattern: a glob (``emb/*/int8*``) or a name prefix (``mlp/``)."""
    if isinstance(patterns, str):
        patterns = [patterns]
    pats = [p for p in (patterns or []) if p]
    items = list(items)
    if not pats:
        return items

    def hit(name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) or (not any(c in p for c in "*?[") and name.startswith(p)) for p in pats)

    return [e for e in items if hit(e.name)]


def entries(patterns: Iterable[str] | str | None = None) -> list[Entry]:
    """Catalogue entries matching ``patterns`` (all when ``None``)."""
    return select(catalogue(), patterns)


# ---------------------------------------------------------------- golden vectors

INDEX = "index.json"
_PREFIX = {"tensors": "t.", "inputs": "i.", "outputs": "o."}


def golden_dir() -> Path:
    """Where golden vectors live (``$OFFLOAD_GOLDEN_DIR`` overrides the packaged ``kernels/golden``)."""
    env = os.environ.get("OFFLOAD_GOLDEN_DIR")
    return Path(env) if env else Path(__file__).parent / "golden"


def golden_path(name: str, root: Path | None = None) -> Path:
    """The ``.npz`` file of entry ``name`` (``/`` in names becomes ``__``)."""
    return (root or golden_dir()) / (name.replace("/", "__") + ".npz")


@dataclass
class Golden:
    """Golden vectors of one entry: spec (JSON), resident tensors, inputs and expected raw outputs."""

    name: str
    kind: str
    seed: int
    spec: dict
    tensors: dict[str, np.ndarray]
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]

    def kernel(self) -> Kernel:
        """The kernel these vectors belong to, rebuilt from the stored spec and tensors."""
        spec = get_kind(self.kind).spec_from_json(self.spec)
        return Kernel(self.name.replace("/", "_"), spec, dict(self.tensors))


def read_index(root: Path | None = None) -> dict[str, dict]:
    """``index.json``: entry name -> {kind, seed, file, spec, arrays}; empty when there is none."""
    p = (root or golden_dir()) / INDEX
    if not p.is_file():
        return {}
    data = json.loads(p.read_text())
    if data.get("format") != 1:
        raise GoldenError(f"{p}: unknown golden index format {data.get('format')!r} (expected 1)")
    return dict(data["entries"])


def load_golden(name: str, root: Path | None = None) -> Golden:
    """Load the golden vectors of entry ``name`` (no pickle); :class:`GoldenError` names what is missing."""
    root = root or golden_dir()
    meta = read_index(root).get(name)
    if meta is None:
        raise GoldenError(f"{name}: no golden vectors in {root / INDEX} (run `offload regress --regenerate --kernel '{name}'`)")
    path = root / meta["file"]
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise GoldenError(f"{name}: cannot read {path}: {e}") from None
    parts: dict[str, dict[str, np.ndarray]] = {k: {} for k in _PREFIX}
    for key, arr in arrays.items():
        for part, pre in _PREFIX.items():
            if key.startswith(pre):
                parts[part][key[len(pre):]] = arr
    if not parts["outputs"]:
        raise GoldenError(f"{name}: {path} holds no expected outputs (o.* arrays)")
    return Golden(name, meta["kind"], int(meta["seed"]), meta["spec"], parts["tensors"], parts["inputs"], parts["outputs"])


def _npz_bytes(g: Golden) -> bytes:
    buf = io.BytesIO()
    arrays = {pre + k: np.ascontiguousarray(v) for part, pre in _PREFIX.items() for k, v in getattr(g, part).items()}
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def write_golden(goldens: Iterable[Golden], root: Path | None = None, *, remove: Iterable[str] = ()) -> None:
    """Write golden files and update the index (keeps other entries; drops ``remove``)."""
    root = root or golden_dir()
    root.mkdir(parents=True, exist_ok=True)
    index = read_index(root)
    for name in remove:
        meta = index.pop(name, None)
        if meta is not None:
            (root / meta["file"]).unlink(missing_ok=True)
    for g in goldens:
        path = golden_path(g.name, root)
        path.write_bytes(_npz_bytes(g))
        index[g.name] = {
            "kind": g.kind,
            "seed": g.seed,
            "file": path.name,
            "spec": g.spec,
            "arrays": {
                pre + k: {"dtype": str(v.dtype), "shape": list(v.shape)}
                for part, pre in _PREFIX.items()
                for k, v in getattr(g, part).items()
            },
        }
    body = {"format": 1, "entries": {k: index[k] for k in sorted(index)}}
    (root / INDEX).write_text(json.dumps(body, indent=1, sort_keys=False) + "\n")


def _count_diff(a: np.ndarray | None, b: np.ndarray | None) -> int | str:
    if a is None or b is None:
        return "added" if a is None else "removed"
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {a.dtype}{list(a.shape)} -> {b.dtype}{list(b.shape)}"
    return int(np.count_nonzero(a != b))


def diff_golden(old: Golden | None, new: Golden) -> dict[str, Any]:
    """What changed between two golden records: spec, and per array the number of differing values.

    Empty dict: identical. ``{"new": True}``: there was no old record.
    """
    if old is None:
        return {"new": True}
    out: dict[str, Any] = {}
    if old.spec != new.spec or old.kind != new.kind:
        out["spec"] = "changed"
    for part in _PREFIX:
        a, b = getattr(old, part), getattr(new, part)
        for k in sorted(set(a) | set(b)):
            d = _count_diff(a.get(k), b.get(k))
            if d != 0:
                out[f"{part}.{k}"] = d
    return out


# ---------------------------------------------------------------- embedding entries
#
# Values: each table's rows are random floats over its format's range, with row 0 at the format's
# maximum, row 1 at its minimum and the last row at exact rounding ties of the lsb. Every input batch
# starts with adversarial bags: a full bag of row 0 (sums saturate / wrap in narrow accumulators),
# a full bag of row 1, an empty bag, a single last-row bag, then random bags of the entry's profile.

_EMB_FORMATS = {
    # name: (table format, acc_type or None for the kind's overflow-free default, out_type or None = acc)
    "ap_fixed16_6": ("ap_fixed<16,6>", None, None),
    "ap_fixed8_3": ("ap_fixed<8,3>", None, None),
    "ap_fixed32_16": ("ap_fixed<32,16>", None, None),
    "ap_ufixed12_4": ("ap_ufixed<12,4>", None, None),
    "ap_fixed16_6-accsat18_8": ("ap_fixed<16,6>", "ap_fixed<18,8,AP_RND_CONV,AP_SAT>", None),
    "ap_fixed16_6-accwrap18_8": ("ap_fixed<16,6>", "ap_fixed<18,8,AP_TRN,AP_WRAP>", None),
    "ap_fixed16_6-out12_6rnd": ("ap_fixed<16,6>", None, "ap_fixed<12,6,AP_RND,AP_SAT>"),
    "int8_rowwise": ("int8_rowwise", None, None),
}
# Bag profiles: name -> (max_bag_size, low, high) for the random bags' lengths.
_BAGS = {"bag1": (1, 1, 1), "bag20": (20, 1, 20), "var64": (64, 0, 64)}


def _emb(mode: str, fmts: str | list[str], dims: int | list[int], bags: str, *, batch: int = 12, rows: int = 97,
         weighted: bool = False, padding: bool = False, tag: str | None = None) -> Entry:
    fl = [fmts] if isinstance(fmts, str) else list(fmts)
    dl = [dims] if isinstance(dims, int) else list(dims)
    if len(dl) == 1 and len(fl) > 1:
        dl = dl * len(fl)
    T = len(fl)
    fname = tag or (fl[0] if T == 1 or len(set(fl)) == 1 else "mixed")
    shown = "none" if bags == "bag1" else ("wsum" if weighted else mode)
    name = f"emb/{shown}/{fname}{'-pad' if padding else ''}/d{'+'.join(map(str, dl))}/{bags}/t{T}"
    params = {"mode": mode, "formats": fl, "dims": dl, "bags": bags, "batch": batch, "rows": rows, "weighted": weighted, "padding": padding}
    return Entry(name, "embedding", params, _build_embedding)


def _emb_weights(rng: np.random.Generator, fmt: str, rows: int, dim: int) -> np.ndarray:
    if fmt == "int8_rowwise":
        # Row-wise quantization adapts to each row's range: give rows very different ranges.
        w = rng.normal(0.0, 1.0, (rows, dim)) * np.exp2(rng.integers(-6, 6, (rows, 1)))
        w[0] = 0.0  # a constant row: scale at its floor
        return w
    t = FixedType.parse(fmt)
    lo, hi, lsb = float(t.min_float), float(t.max_float), float(t.lsb)
    w = rng.uniform(lo, hi, (rows, dim))
    w[0], w[1] = hi, lo
    w[-1] = np.clip((rng.integers(-8, 8, dim) + 0.5) * lsb, lo, hi)  # rounding ties of the quantizer
    return w


def _build_embedding(e: Entry, rng: np.random.Generator) -> Case:
    p = e.params
    tables, weights = [], []
    acc = out = None
    for t, (fname, dim) in enumerate(zip(p["formats"], p["dims"])):
        fmt, acc_t, out_t = _EMB_FORMATS[fname]
        acc, out = acc or acc_t, out or out_t
        w = _emb_weights(rng, fmt, p["rows"], dim)
        pt = emb.rowwise_param_type(w) if fmt == emb.ROWWISE else None
        pad = 3 if (p["padding"] and t == 0) else None
        tables.append(emb.TableSpec(f"t{t}", p["rows"], dim, fmt, pt, pad))
        weights.append(w)
    max_bag, lo, hi = _BAGS[p["bags"]]
    spec = emb.make_spec(tables, mode=p["mode"], max_bag_size=max_bag, acc_type=acc, out_type=out)
    kernel = emb.make_kernel(e.name.replace("/", "_"), spec, weights)

    B, rows = p["batch"], p["rows"]
    lens = rng.integers(lo, hi + 1, (len(tables), B))
    fixed = [max_bag, max_bag, 1 if p["bags"] == "bag1" else 0, 1]  # adversarial bags first (see above)
    lens[:, : len(fixed)] = np.minimum(fixed, max_bag)[None, :]
    idx_parts = []
    for t in range(len(tables)):
        for b in range(B):
            n = int(lens[t, b])
            if b == 0:
                ix = np.zeros(n, np.int64)
            elif b == 1:
                ix = np.ones(n, np.int64)
            elif b == 3:
                ix = np.full(n, rows - 1, np.int64)
            else:
                ix = rng.integers(0, rows, n)
                if p["padding"] and n > 1:
                    ix[rng.integers(0, n)] = 3
            idx_parts.append(ix.astype(np.int64))
    indices = np.concatenate(idx_parts) if idx_parts else np.zeros(0, np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens.reshape(-1))]).astype(np.int64)
    inputs = {"indices": indices, "offsets": offsets}
    if p["weighted"]:
        wt = spec.weight_type
        w = rng.integers(int(wt.min_raw), int(wt.max_raw) + 1, indices.shape[0], dtype=np.int64)
        w[: lens[0, 0]] = int(wt.max_raw)  # the full max-row bag at the largest weight: the biggest sum
        inputs["per_sample_weights"] = w.astype(emb.container_dtype(wt))
    return Case(kernel, inputs)


def _embedding_entries() -> list[Entry]:
    return [
        _emb("sum", "ap_fixed16_6", 16, "bag20"),
        _emb("mean", "ap_fixed16_6", 16, "bag20"),
        _emb("max", "ap_fixed16_6", 16, "bag20"),
        _emb("sum", "ap_fixed16_6", 16, "bag1"),
        _emb("sum", "ap_fixed16_6", 128, "bag20", batch=6),
        _emb("sum", "ap_fixed8_3", 4, "var64"),
        _emb("mean", "ap_fixed8_3", 64, "var64"),
        _emb("max", "ap_fixed8_3", 4, "var64"),
        _emb("sum", "ap_fixed32_16", 16, "bag20"),
        _emb("mean", "ap_ufixed12_4", 16, "bag20"),
        _emb("sum", "ap_fixed16_6-accsat18_8", 16, "bag20"),
        _emb("sum", "ap_fixed16_6-accwrap18_8", 16, "bag20"),
        _emb("mean", "ap_fixed16_6-accwrap18_8", 16, "var64"),
        _emb("mean", "ap_fixed16_6-out12_6rnd", 16, "var64"),
        _emb("sum", "ap_fixed16_6", 16, "bag20", padding=True),
        _emb("sum", "int8_rowwise", 16, "bag20"),
        _emb("mean", "int8_rowwise", 64, "var64"),
        _emb("max", "int8_rowwise", 16, "bag20"),
        _emb("sum", "int8_rowwise", 4, "bag1"),
        _emb("sum", "ap_fixed16_6", 16, "bag20", weighted=True),
        _emb("sum", "int8_rowwise", 16, "var64", weighted=True),
        _emb("sum", ["ap_fixed16_6", "int8_rowwise", "ap_fixed8_3"], [16, 4, 64], "bag20"),
        _emb("mean", ["ap_fixed16_6"] * 3, 16, "var64"),
        _emb("max", ["int8_rowwise", "ap_fixed8_3"], [16, 4], "var64"),
    ]


# ---------------------------------------------------------------- MLP entries
#
# Precision profiles: (input, weight, bias, accum, result) ap_types types. "wrap" keeps hls4ml's
# default everywhere (ap_fixed<16,6>, AP_TRN/AP_WRAP: accumulators overflow and wrap); "sat"
# narrows weights and results with rounding and saturation. Weights are raw random integers over
# the weight type's whole range with its extremes present; inputs cover the input type's range,
# exact rounding ties, and values beyond the range (the input cast wraps or saturates).

_MLP_PRECISIONS = {
    "ap_fixed16_6": ("ap_fixed<16,6>", "ap_fixed<16,6>", "ap_fixed<16,6>", "ap_fixed<32,12>", "ap_fixed<16,6>"),
    "ap_fixed8_3": ("ap_fixed<16,6>", "ap_fixed<8,3>", "ap_fixed<8,3>", "ap_fixed<24,10>", "ap_fixed<12,4,AP_RND,AP_SAT>"),
    "ap_fixed16_6-wrap": ("ap_fixed<16,6>", "ap_fixed<16,6>", "ap_fixed<16,6>", "ap_fixed<16,6>", "ap_fixed<16,6>"),
    "ap_fixed10_4-sat": ("ap_fixed<12,4,AP_RND_CONV,AP_SAT>", "ap_fixed<10,2,AP_RND_CONV,AP_SAT>", "ap_fixed<10,4,AP_RND_CONV,AP_SAT>",
                         "ap_fixed<28,10,AP_RND_CONV,AP_SAT>", "ap_fixed<10,4,AP_RND_CONV,AP_SAT>"),
}


def _mlp(arch: str, precision: str, reuse: int, act: str, *, out_act: str | None = None, batch: int = 24,
         strategy: str = LATENCY) -> Entry:
    # DA entries say "da" where latency ones give the reuse factor: DA runs at reuse factor 1 only.
    step = "da" if strategy == DA else f"r{reuse}"
    name = f"mlp/{arch}/{precision}/{step}/{act}" + (f"+{out_act}" if out_act else "")
    params = {"arch": arch, "precision": precision, "reuse": reuse, "act": act, "out_act": out_act, "batch": batch}
    if strategy != LATENCY:
        params["strategy"] = strategy
    return Entry(name, "mlp", params, _build_mlp)


def _raw_weights(rng: np.random.Generator, t: FixedType, shape: tuple[int, ...]) -> np.ndarray:
    # Trained-network magnitudes (most weights well inside the range) plus both extremes once.
    scale = min(0.5, float(t.max_float) / 4)
    raw = np.clip(np.floor(rng.normal(0.0, scale, shape) / float(t.lsb)), int(t.min_raw), int(t.max_raw)).astype(np.int64)
    flat = raw.reshape(-1)
    flat[0], flat[-1] = int(t.max_raw), int(t.min_raw)
    return raw


def _activation_layer(name: str, op: str, n: int, result: str):
    if op == "leaky_relu":
        return MlpLayer(name, op, n, n, result, param="ap_fixed<16,6>", alpha=0.125)
    if op in ("sigmoid", "tanh"):
        # hls4ml's defaults: an ap_fixed<18,8> table of 1024 entries.
        return MlpLayer(name, op, n, n, result, table="ap_fixed<18,8>", table_size=1024)
    return MlpLayer(name, op, n, n, result)


def _build_mlp(e: Entry, rng: np.random.Generator) -> Case:
    p = e.params
    in_t, w_t, b_t, acc_t, res_t = _MLP_PRECISIONS[p["precision"]]
    strategy = p.get("strategy", LATENCY)
    if strategy == DA:
        acc_t = None  # exact under DA: the spec derives it
    parts = p["arch"].split("-")
    n_features = int(parts[0])
    layers, consts = [], {}
    width = n_features
    dense = [x for x in parts[1:]]
    for i, tok in enumerate(dense):
        last = i == len(dense) - 1
        if tok == "bn":
            name = f"bn{i}"
            layers.append(MlpLayer(name, "batchnorm", width, width, res_t, scale=w_t, bias=b_t))
            consts[f"{name}.scale"] = _raw_weights(rng, layers[-1].scale, (width,))
            consts[f"{name}.bias"] = _raw_weights(rng, layers[-1].bias, (width,))
            continue
        n_out = int(tok)
        name = f"fc{i}"
        layers.append(MlpLayer(name, "dense", width, n_out, res_t, weight=w_t, bias=b_t, accum=acc_t))
        consts[f"{name}.weight"] = _raw_weights(rng, layers[-1].weight, (width, n_out))
        consts[f"{name}.bias"] = _raw_weights(rng, layers[-1].bias, (n_out,))
        width = n_out
        act = p["out_act"] if last else p["act"]
        if act:
            layers.append(_activation_layer(f"{act}{i}", act, width, res_t))
    spec = MlpSpec(n_features=n_features, input_type=in_t, layers=tuple(layers), constants=consts, reuse_factor=p["reuse"],
                   strategy=strategy)
    kernel = Kernel(e.name.replace("/", "_"), spec, spec.tensors())

    it = spec.input_type
    lo, hi, lsb = float(it.min_float), float(it.max_float), float(it.lsb)
    B = p["batch"]
    x = rng.uniform(lo / 4, hi / 4, (B, n_features))
    x[0], x[1], x[2] = hi, lo, 0.0
    x[3] = (rng.integers(-64, 64, n_features) + 0.5) * lsb  # ties of the input cast's rounding
    x[4] = rng.uniform(hi, 2 * hi, n_features) * rng.choice([-1, 1], n_features)  # beyond the range
    x[5] = rng.uniform(-1, 1, n_features) * lsb * 3  # a few lsb around zero
    return Case(kernel, {"x": x})


def _mlp_entries() -> list[Entry]:
    return [
        _mlp("16-8-1", "ap_fixed16_6", 1, "relu"),
        _mlp("16-8-1", "ap_fixed8_3", 2, "relu"),
        _mlp("32-16-8-1", "ap_fixed16_6", 4, "relu"),
        _mlp("16-16-4", "ap_fixed16_6-wrap", 1, "leaky_relu"),
        _mlp("16-8-1", "ap_fixed16_6", 1, "relu", out_act="sigmoid"),
        _mlp("12-8-2", "ap_fixed10_4-sat", 1, "tanh"),
        _mlp("16-bn-8-1", "ap_fixed16_6", 2, "relu", out_act="sigmoid"),
        _mlp("8-4", "ap_fixed8_3", 1, "tanh", out_act="tanh"),
        # The risk MLP's shape (offload/examples/risk.py) under distributed arithmetic (da4ml adder graphs).
        _mlp("16-32-16-1", "ap_fixed8_3", 1, "relu", out_act="sigmoid", strategy=DA),
    ]
