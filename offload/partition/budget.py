"""Partition pass: the card's memory budget. Tables claim card memory in graph order; one that no
longer fits stays on the host, with the numbers in its report row.

Card facts (memory size, datasheet) come from :mod:`offload.hls.cards`.
"""

from __future__ import annotations

import re
from collections import Counter

from offload.partition.state import TABLE_KINDS, State, table_key
from offload.sim.errors import FormatError

__all__ = ["apply", "table_bytes"]


def table_bytes(rows: int, dim: int, fmt: str) -> int:
    """Bytes a table occupies on the card in ``fmt`` (raw fixed-point in its power-of-two container;
    int8 row-wise: one byte a value plus a raw (scale, bias) pair a row, 2 x 4 bytes)."""
    if fmt == "int8_rowwise":
        return rows * (dim + 8)
    m = re.match(r"\s*ap_u?(?:fixed|int)<\s*(\d+)", fmt)
    if m is None:
        raise FormatError(f"fmt {fmt!r}: expected 'ap_fixed<W,I>', 'ap_int<W>' or 'int8_rowwise'")
    w = int(m.group(1))
    container = next(b for b in (8, 16, 32, 64) if w <= b) if w <= 64 else w
    return rows * dim * container // 8


def apply(st: State) -> None:
    """Pass: charge every table to the card, in graph order, and keep on the host those that do not
    fit. A table called from several places is charged once (its offload module is shared) and
    never batched; the bag tables charged and called once are ``st.batchable``."""
    free = st.card.memory_bytes
    calls = Counter(table_key(c) for c in st.candidates)
    counted: set[tuple] = set()
    for c in st.candidates:
        if c.kind not in TABLE_KINDS or table_key(c) in counted:
            continue
        need = table_bytes(c.module.num_embeddings, c.module.embedding_dim, st.fmt)
        if need > free:
            st.decisions[c.name].reason = (
                f"table needs {need / 2**20:.1f} MiB in {st.fmt}; {st.card.name} has {free / 2**20:.1f} MiB of card "
                f"memory left ({st.card.memory_bytes / 2**30:.0f} GiB total, {st.card.datasheet})")
            continue
        free -= need
        counted.add(table_key(c))
        st.report.card_bytes_used += need
        if c.kind == "embedding_bag" and calls[table_key(c)] == 1:
            st.batchable.append(c)
