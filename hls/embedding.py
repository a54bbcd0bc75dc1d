"""HLS generator for kernel kind ``embedding``: config header + ``extern "C"`` top from the spec.

The loop body is the generic ``hls/src/offload_embedding.h``; what changes per model (types,
dims, padding rows, formats, m_axi bundles) is written here as a constants header, so no C++ is
edited by hand per model.

A table held on chip (:attr:`TableSpec.onchip`, see :func:`offload.kernels.embedding.hold_on_chip`)
has no port: its raw contents are a ``static const`` array in the top function, which Vitis HLS
builds as a ROM initialised in the bitstream (UG1399, "Implementing ROMs" and "Array
Initialization"), bound to block RAM or UltraRAM by ``#pragma HLS bind_storage variable=tableN
type=rom_2p impl=bram|uram`` written in the body of the function that defines the array (UG1399,
"pragma HLS bind_storage"). The contents are part of the spec, so of the kernel's name. Two
ports (rom_2p): the pipelined element loop may read two elements a cycle. A card takes on-chip
tables up to its BRAM36 / URAM block count (:func:`check_onchip`). UltraScale+ UltraRAM has no
initial-content attribute (UG573's UltraRAM attributes; initialisation came with Versal,
UG1273), so a URAM ROM on these cards relies on what Vitis HLS makes of it for the part: BRAM is
the memory that is initialised in the bitstream on every card here.

Top function ABI (every pointer is a plain integer array; no ap_fixed crosses the ABI)::

    void offload_embedding_<hash>(
        const <store> *table0, [const <pstore> *params0,]   // per off-chip table, resident, bundle of the table
        ...,
        const int64_t *indices, const int64_t *offsets,     // input, bundle gmem_io
        const <wstore> *per_sample_weights,                  // input (raw weight_type; dummy if unweighted)
        <ostore> *out,                                       // output, B x total_dim raw out_type
        int num_bags, int weighted)                          // scalars (s_axilite)

Example::

    from offload.hls.registry import get_hls_kind
    hk = get_hls_kind("embedding")
    srcs = hk.sources(spec); args = hk.top_args(spec)
    where = hk.placement(spec, "u55c", 1, {"item": 20.0})   # tables over HBM banks by size and traffic
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

import numpy as np

from offload.hls.cards import Card, get_card
from offload.hls.connectivity import Item, place
from offload.hls.registry import HlsKind, KernelArg, KernelPlacement, register_hls_kind
from offload.kernels.embedding import EmbeddingSpec, TableSpec, container_dtype
from offload.sim.fixed import FixedType
from offload.sim.errors import FormatError, InputError

__all__ = ["top_name", "sources", "top_args", "pack_resident", "pack_inputs", "unpack_outputs", "placement", "table_bundle",
           "onchip_blocks", "check_onchip", "OnChipBudgetError", "HLS_KIND"]

_MODES = {"sum": 0, "mean": 1, "max": 2}
_CTYPE = {
    "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "uint16": "uint16_t",
    "int32": "int32_t", "uint32": "uint32_t", "int64": "int64_t", "uint64": "uint64_t",
}
IO_BUNDLE = "gmem_io"
# Bags per call that C/RTL co-simulation provisions: every m_axi port declares a depth (UG1399,
# "Multi-Access Pointers and RTL Simulation": cosim reads past an undeclared depth and stalls or
# fails). The catalogue's golden vectors hold 12 bags per table; hardware ignores depth.
COSIM_BAGS = 64
# Block shapes (depth, bits) each on-chip memory can take (UG573): a URAM288 is 4K x 72 bits; a
# RAMB36E2 is 36 Kb as 32K x 1 up to 512 x 72 (simple dual port), parity bits counted. The card
# counts (BRAM36, URAM) are hls/cards.py's.
_SHAPES = {"uram": ((4096, 72),),
           "bram": ((32768, 1), (16384, 2), (8192, 4), (4096, 9), (2048, 18), (1024, 36), (512, 72))}
_BLOCK_NAME = {"uram": "URAM", "bram": "BRAM36"}


class OnChipBudgetError(InputError):
    """An on-chip table (with the kernel's others in the same memory) needs more blocks than the card has."""


def _cpp_type(t: FixedType) -> str:
    # str(FixedType) is the ap_types spelling, e.g. "ap_fixed<16,6,AP_RND_CONV,AP_SAT>".
    return str(t)


def _digest(spec: EmbeddingSpec) -> str:
    return spec.digest()[:10]


def top_name(spec: EmbeddingSpec) -> str:
    """``offload_embedding_<hash of the spec>``: distinct kernels get distinct names in one xclbin."""
    return f"offload_embedding_{_digest(spec)}"


def table_bundle(spec: EmbeddingSpec, t: int) -> str:
    """The m_axi bundle of table ``t`` (its own port unless the spec groups tables)."""
    return spec.tables[t].bundle or f"gmem{t}"


def _param_dtype(ts: TableSpec) -> np.dtype:
    return ts.fmt.params_dtype if ts.rowwise else np.dtype(np.int8)


def _blocks(depth: int, bits: int, memory: str) -> int:
    return min(math.ceil(bits / w) * math.ceil(depth / d) for d, w in _SHAPES[memory])


def onchip_blocks(ts: TableSpec, memory: str | None = None) -> int:
    """Blocks of ``memory`` (``"bram"``: BRAM36, ``"uram"``; default the table's own on-chip
    memory) a table's ROMs take: the codes (``rows * dim`` words of the storage container's width)
    and a row-wise table's params (``2 * rows`` words), each array in the block shape that needs
    fewest."""
    mem = memory or (ts.onchip.memory if ts.onchip is not None else None)
    if mem not in _SHAPES:
        raise InputError(f"table {ts.name!r}: memory must be one of {sorted(_SHAPES)} (or the table on chip), got {mem!r}")
    n = _blocks(ts.num_rows * ts.dim, 8 * ts.storage_dtype().itemsize, mem)
    if ts.rowwise:
        n += _blocks(2 * ts.num_rows, 8 * _param_dtype(ts).itemsize, mem)
    return n


def check_onchip(spec: EmbeddingSpec, card: str | Card, used: Mapping[str, int] | None = None) -> dict[str, int]:
    """Refuse a kernel whose on-chip tables need more BRAM36 or URAM blocks than ``card`` has
    (:class:`OnChipBudgetError`, naming the table that crosses the limit, its bytes and the limit).
    ``used``: blocks (``{"bram": n, "uram": m}``) the card's other kernels already take; returns
    the blocks taken with this kernel's.

    Example: ``check_onchip(spec, "u55c")`` -> ``{"bram": 3, "uram": 0}``
    """
    card = get_card(card)
    have = {"bram": card.bram36, "uram": card.uram}
    used = {m: int((used or {}).get(m, 0)) for m in have}
    for ts in spec.tables:
        if ts.onchip is None:
            continue
        mem = ts.onchip.memory
        n = onchip_blocks(ts)
        used[mem] += n
        if used[mem] > have[mem]:
            unit = _BLOCK_NAME[mem]
            block_bytes = max(d * w for d, w in _SHAPES[mem]) // 8  # with the parity bits: 36 Kb, 288 Kb
            others = f" after the {used[mem] - n} other tables take" if used[mem] > n else ""
            raise OnChipBudgetError(
                f"table {ts.name!r}: {ts.bytes()} bytes on chip take {n} {unit} blocks{others}; card {card.name} has "
                f"{have[mem]} {unit} blocks ({have[mem] * block_bytes} bytes)")
    return used


def _check_hls(spec: EmbeddingSpec) -> None:
    # The C++ top walks one bag group per table; shared tables (feature_table_map) run on the sim device only.
    if spec.feature_table_map is not None:
        raise FormatError("feature_table_map: the HLS embedding kernel has one feature per table; "
                          "build with one table per feature, or use the sim device")


def _out_dtype(spec: EmbeddingSpec) -> np.dtype:
    # A partial kernel returns the raw accumulator (see offload_embedding.h).
    return container_dtype(spec.acc_type if spec.partial else spec.out_type)


def top_args(spec: EmbeddingSpec) -> list[KernelArg]:
    _check_hls(spec)
    out_t, wt = spec.out_type, spec.weight_type
    args: list[KernelArg] = []
    for t, ts in enumerate(spec.tables):
        if ts.onchip is not None:  # compiled into the kernel: no port
            continue
        args.append(KernelArg(f"table{t}", "resident", ts.storage_dtype(), table_bundle(spec, t)))
        if ts.rowwise:
            args.append(KernelArg(f"params{t}", "resident", _param_dtype(ts), table_bundle(spec, t)))
    args += [
        KernelArg("indices", "input", np.dtype(np.int64), IO_BUNDLE),
        KernelArg("offsets", "input", np.dtype(np.int64), IO_BUNDLE),
        KernelArg("per_sample_weights", "input", container_dtype(wt), IO_BUNDLE),
        KernelArg("out", "output", _out_dtype(spec), IO_BUNDLE),
        *([KernelArg("count", "output", np.dtype(np.int64), IO_BUNDLE)] if spec.partial else []),
        KernelArg("num_bags", "scalar", np.dtype(np.int32)),
        KernelArg("weighted", "scalar", np.dtype(np.int32)),
    ]
    return args


def _table_struct(spec: EmbeddingSpec, t: int, col: int) -> str:
    ts = spec.tables[t]
    vt = spec.value_types[t]
    store = _CTYPE[ts.storage_dtype().name]
    pstore = _CTYPE[_param_dtype(ts).name]
    has_pad = ts.padding_idx is not None
    lines = [
        f"struct emb_t{t} {{  // table {ts.name!r}: {ts.num_rows} x {ts.dim}, {ts.fmt}",
        f"    typedef {store} store_t;",
        f"    typedef {pstore} pstore_t;",
        f"    typedef {_cpp_type(vt)} value_t;",
    ]
    if ts.rowwise:
        lines += [
            f"    typedef {_cpp_type(ts.param_type)} param_t;",
            "    static void load_params(const pstore_t *p, int64_t row, param_t &s, param_t &b) {",
            "        s = offload_emb::from_raw<param_t>(p[2 * row]);",
            "        b = offload_emb::from_raw<param_t>(p[2 * row + 1]);",
            "    }",
            "    // code * scale + bias: exact (value_t is the ap_types result type of the expression).",
            "    static value_t read(const store_t *tab, int64_t row, int d, const param_t &s, const param_t &b) {",
            "        return value_t(ap_uint<8>(tab[row * dim + d]) * s + b);",
            "    }",
        ]
    else:
        lines += [
            "    typedef ap_fixed<8, 1> param_t;  // unused: no per-row parameters",
            "    static void load_params(const pstore_t *, int64_t, param_t &, param_t &) {}",
            "    static value_t read(const store_t *tab, int64_t row, int d, const param_t &, const param_t &) {",
            "        return offload_emb::from_raw<value_t>(tab[row * dim + d]);",
            "    }",
        ]
    lines += [
        f"    static const int dim = {ts.dim};",
        f"    static const int64_t rows = {ts.num_rows};",
        f"    static const bool has_padding = {'true' if has_pad else 'false'};",
        f"    static const int64_t padding = {ts.padding_idx if has_pad else -1};",
        f"    static const int col = {col};",
        "};",
    ]
    return "\n".join(lines)


def _spec_comment(spec: EmbeddingSpec) -> dict:
    """The spec's JSON with on-chip contents counted, not listed (the top function lists them)."""
    d = spec.to_json()
    for t in d["tables"]:
        oc = t.get("onchip")
        if oc is not None:
            t["onchip"] = {"memory": oc["memory"], "table": f"<{len(oc['table'])} values>", "params": f"<{len(oc['params'])} values>"}
    return d


def _literal(v: int, ctype: str) -> str:
    # -2^63 has no int64_t literal (the minus applies to a constant too large for long long).
    if ctype == "int64_t":
        return "(-9223372036854775807LL - 1)" if v == -(1 << 63) else f"{v}LL"
    return f"{v}ULL" if ctype == "uint64_t" else str(v)


def _rom(name: str, ctype: str, values: tuple[int, ...], memory: str) -> list[str]:
    """A ``static const`` array of ``values`` and its bind_storage pragma, in the top function's body."""
    per_line = 16
    rows = [", ".join(_literal(v, ctype) for v in values[i:i + per_line]) for i in range(0, len(values), per_line)]
    return [
        f"    static const {ctype} {name}[{len(values)}] = {{",
        *(f"        {r}," for r in rows),
        "    };",
        f"#pragma HLS bind_storage variable={name} type=rom_2p impl={memory}",
    ]


def _config_header(spec: EmbeddingSpec) -> str:
    acc, out_t, wt = spec.acc_type, spec.out_type, spec.weight_type
    guard = f"OFFLOAD_EMB_CFG_{_digest(spec).upper()}"
    structs = []
    for t, col in enumerate(spec.col_offsets()):
        structs.append(_table_struct(spec, t, col))
    return "\n".join([
        "// Generated by offload.hls.embedding from the kernel spec; do not edit.",
        f"// spec: {json.dumps(_spec_comment(spec), sort_keys=True)}",
        f"#ifndef {guard}",
        f"#define {guard}",
        f"#define OFFLOAD_EMB_MAX_BAG {spec.max_bag_size}",
        '#include "offload_embedding.h"',
        "",
        "struct emb_kernel {",
        f"    typedef {_cpp_type(acc)} acc_t;",
        f"    typedef {_cpp_type(out_t)} out_t;",
        f"    typedef {_cpp_type(wt)} weight_t;",
        f"    typedef {_CTYPE[container_dtype(wt).name]} wstore_t;",
        f"    typedef {_CTYPE[_out_dtype(spec).name]} ostore_t;",
        f"    static const int mode = {_MODES[spec.mode]};  // {spec.mode}",
        f"    static const int total_dim = {spec.total_dim};",
        f"    static const int max_bag = {spec.max_bag_size};",
        f"    static const bool out_signed = {'true' if out_t.signed else 'false'};",
        "};",
        "",
        *structs,
        "",
        "#endif",
        "",
    ])


def port_depths(spec: EmbeddingSpec) -> dict[str, int]:
    """Elements each m_axi port can hold in co-simulation: whole tables, and calls of up to
    :data:`COSIM_BAGS` bags per table with full bags."""
    T = spec.num_tables
    depths = {}
    for t, ts in enumerate(spec.tables):
        # An on-chip table has no port; its depth is unused.
        depths[f"table{t}"] = ts.num_rows * ts.dim
        depths[f"params{t}"] = 2 * ts.num_rows
    n_idx = COSIM_BAGS * T * spec.max_bag_size
    depths.update({"indices": n_idx, "offsets": COSIM_BAGS * T + 1, "per_sample_weights": n_idx, "out": COSIM_BAGS * spec.total_dim,
                   "count": COSIM_BAGS * T})
    return depths


def sources(spec: EmbeddingSpec) -> dict[str, str]:
    _check_hls(spec)
    """``{"offload_embedding_cfg.h": ..., "<top>.cpp": ...}``; the generic body is included from hls/src."""
    name = top_name(spec)
    params: list[str] = []
    pragmas: list[str] = []
    calls: list[str] = []
    depths = port_depths(spec)
    for a in top_args(spec):
        if a.role == "scalar":
            params.append(f"int {a.name}")
            pragmas.append(f"#pragma HLS INTERFACE s_axilite port = {a.name}")
            continue
        const = "" if a.role == "output" else "const "
        params.append(f"{const}{_CTYPE[np.dtype(a.dtype).name]} *{a.name}")
        pragmas.append(f"#pragma HLS INTERFACE m_axi port = {a.name} offset = slave bundle = {a.bundle} depth = {depths[a.name]}")
    roms: list[str] = []
    for t, ts in enumerate(spec.tables):
        if ts.onchip is not None:
            # Named as the port would be, so the calls below read the same either way.
            roms.append(f"    // table {ts.name!r} on chip ({ts.onchip.memory.upper()} ROM), compiled in.")
            roms += _rom(f"table{t}", _CTYPE[ts.storage_dtype().name], ts.onchip.table, ts.onchip.memory)
            if ts.rowwise:
                roms += _rom(f"params{t}", _CTYPE[_param_dtype(ts).name], ts.onchip.params, ts.onchip.memory)
    for t, ts in enumerate(spec.tables):
        p = f"params{t}" if ts.rowwise else f"(const emb_t{t}::pstore_t *)0"
        if spec.partial:
            calls.append(
                f"    offload_emb::pool_table_partial<emb_kernel, emb_t{t}>(table{t}, {p}, indices, offsets, "
                f"per_sample_weights, out, count, num_bags, {t}, {spec.num_tables}, weighted);"
            )
        else:
            calls.append(
                f"    offload_emb::pool_table<emb_kernel, emb_t{t}>(table{t}, {p}, indices, offsets, "
                f"per_sample_weights, out, num_bags, {t}, weighted);"
            )
    top = "\n".join([
        "// Generated by offload.hls.embedding; do not edit.",
        '#include "offload_embedding_cfg.h"',
        "",
        f'extern "C" void {name}(',
        "    " + ",\n    ".join(params) + ") {",
        *pragmas,
        "#pragma HLS INTERFACE s_axilite port = return",
        *roms,
        *calls,
        "}",
        "",
    ])
    return {"offload_embedding_cfg.h": _config_header(spec), f"{name}.cpp": top}


def pack_resident(spec: EmbeddingSpec, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for a in top_args(spec):
        if a.role == "resident":
            out[a.name] = np.ascontiguousarray(tensors[a.name], dtype=a.dtype)
    return out


def pack_inputs(spec: EmbeddingSpec, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Inputs as the top function's buffers. Buffers are never empty (a card cannot allocate 0
    bytes): empty arrays become one ignored element."""
    out_t, wt = spec.out_type, spec.weight_type
    idx = np.ascontiguousarray(inputs["indices"], dtype=np.int64)
    off = np.ascontiguousarray(inputs["offsets"], dtype=np.int64)
    w = inputs.get("per_sample_weights")
    B = (off.shape[0] - 1) // spec.num_tables
    wbuf = np.ascontiguousarray(w, dtype=container_dtype(wt)) if w is not None else np.zeros(1, container_dtype(wt))
    return {
        "indices": idx if idx.size else np.zeros(1, np.int64),
        "offsets": off,
        "per_sample_weights": wbuf if wbuf.size else np.zeros(1, container_dtype(wt)),
        "out": np.zeros((max(B, 1), spec.total_dim), dtype=_out_dtype(spec)),
        **({"count": np.zeros((max(B, 1), spec.num_tables), dtype=np.int64)} if spec.partial else {}),
        "num_bags": int(B),
        "weighted": int(w is not None),
    }


def unpack_outputs(spec: EmbeddingSpec, inputs: Mapping[str, np.ndarray], buffers: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    B = (inputs["offsets"].shape[0] - 1) // spec.num_tables
    out = np.asarray(buffers["out"]).reshape(-1, spec.total_dim)[:B]
    if spec.partial:
        return {"out": out.astype(np.int64), "count": np.asarray(buffers["count"]).reshape(-1, spec.num_tables)[:B].astype(np.int64)}
    return {"out": out.astype(np.int64)}


def placement(spec: EmbeddingSpec, card: str | Card, compute_units: int = 1, traffic: Mapping[str, float] | None = None) -> KernelPlacement:
    """Each table bundle in its own bank (or run of HBM banks), by size and traffic (:func:`offload.hls.connectivity.place`);
    on-chip tables have no port, and a card without the blocks for them is refused (:func:`check_onchip`).

    ``traffic`` maps a table name to its expected lookups per sample (default 1); a bundle's
    traffic is that times its tables' row bytes. The per-call buffers (indices, offsets, weights,
    out) share one small port on the bank with the least traffic left, and every CU sits on the
    SLR next to the bank it reads most (on U250 each DDR bank hangs off its own SLR). Each compute
    unit gets the same banks: they share the resident tables.
    """
    card = get_card(card)
    check_onchip(spec, card)
    mem = card.memory
    traffic = dict(traffic or {})
    unknown = set(traffic) - {t.name for t in spec.tables}
    if unknown:
        raise InputError(f"traffic: unknown tables {sorted(unknown)}")
    # Tables sharing a bundle share a port, hence a bank: place bundles, not tables. On-chip
    # tables have no port.
    groups: dict[str, list[int]] = {}
    for t in range(spec.num_tables):
        if spec.tables[t].onchip is None:
            groups.setdefault(table_bundle(spec, t), []).append(t)
    items = []
    for bundle, ts in groups.items():
        nbytes = sum(spec.tables[t].bytes() for t in ts)
        tr = sum(traffic.get(spec.tables[t].name, 1.0) * spec.tables[t].bytes() / spec.tables[t].num_rows for t in ts)
        items.append(Item(bundle, nbytes, tr))
    placed = place(items, card)
    load = [0.0] * mem.banks
    for it in items:
        pl = placed[it.name]
        for b in range(pl.first, pl.last + 1):
            load[b] += it.traffic / (pl.last - pl.first + 1)
    io_bank = f"{mem.kind}[{min(range(mem.banks), key=lambda b: (load[b], b))}]"
    busiest = max(range(mem.banks), key=lambda b: (load[b], -b))
    ports = {a.name: (placed[a.bundle].spelling(mem.kind) if a.role == "resident" else io_bank) for a in top_args(spec) if a.role != "scalar"}
    top = top_name(spec)
    cus = tuple(f"{top}_{i + 1}" for i in range(compute_units))
    return KernelPlacement(cus, {cu: f"SLR{mem.slr_of_bank[busiest]}" for cu in cus}, {cu: dict(ports) for cu in cus})


HLS_KIND = register_hls_kind(HlsKind("embedding", top_name, sources, top_args, pack_resident, pack_inputs, unpack_outputs, placement))
