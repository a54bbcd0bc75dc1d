"""An embedding table's storage format, parsed once: a :class:`~offload.sim.fixed.FixedType` for a
plain fixed-point table, :class:`RowwiseInt8` for FBGEMM-style 8-bit row-wise codes.

The text forms (``"ap_fixed<16,6>"``, ``"int8_rowwise"`` with its ``param_type``) live only at the
edges (JSON, user calls); :func:`table_format` turns them into the object, ``str()`` gives the
text back unchanged for canonical input, so specs serialize as they always have.

Example::

    >>> fmt = table_format("int8_rowwise", "ap_fixed<24,4,AP_RND_CONV,AP_SAT>")
    >>> str(fmt), str(fmt.value_type), fmt.storage_dtype, fmt.params_dtype
    ('int8_rowwise', 'ap_fixed<33,13>', dtype('uint8'), dtype('int32'))
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Union

import numpy as np

from offload.sim.embedding import rowwise_value_type
from offload.sim.errors import FormatError
from offload.sim.fixed import FixedType

__all__ = ["ROWWISE", "RowwiseInt8", "TableFormat", "table_format", "container_dtype"]

# The text name of the row-wise format (JSON, CLI, user calls): what str(RowwiseInt8(...)) gives.
ROWWISE = "int8_rowwise"


@functools.lru_cache(maxsize=256)  # on every request's packing: a dtype from text each time costs more than the rest
def container_dtype(t: FixedType) -> np.dtype:
    """Smallest NumPy integer holding ``t``'s raw bits (signedness follows the type)."""
    w = int(t.width)
    for bits in (8, 16, 32, 64):
        if w <= bits:
            return np.dtype(f"{'int' if t.signed else 'uint'}{bits}")
    raise ValueError(f"type {t} is wider than 64 bits")


@dataclass(frozen=True)
class RowwiseInt8:
    """``uint8`` codes plus, per row, raw ``(scale, bias)`` in ``param_type``; an element is
    ``code * scale + bias``, formed exactly. FBGEMM's fused 8-bit row-wise with a fixed-point
    scale and bias instead of fp16/fp32, so the hardware needs no float unit.

    Example: ``RowwiseInt8(FixedType.parse("ap_fixed<24,4>")).value_type`` is ``ap_fixed<33,13>``.
    """

    param_type: FixedType
    value_type: FixedType = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.param_type, FixedType):
            raise TypeError(f"RowwiseInt8.param_type must be a FixedType, got {type(self.param_type).__name__}")
        object.__setattr__(self, "value_type", rowwise_value_type(self.param_type))

    def __str__(self) -> str:
        return ROWWISE

    @property
    def storage_dtype(self) -> np.dtype:
        return np.dtype(np.uint8)

    @property
    def params_dtype(self) -> np.dtype:
        """Container of the raw per-row scale and bias."""
        return container_dtype(self.param_type)


TableFormat = Union[FixedType, RowwiseInt8]


def table_format(fmt: "str | TableFormat", param_type: "str | FixedType | None" = None, *, what: str = "fmt") -> TableFormat:
    """The format object of ``fmt`` (an ap_types type, ``"int8_rowwise"`` or an object already);
    ``param_type`` is the row-wise scale/bias type. Raises :class:`FormatError`: the parser's
    message, then ``what`` and the field."""
    if isinstance(fmt, (FixedType, RowwiseInt8)) and param_type is None:
        return fmt
    pt = None
    if param_type is not None:
        try:
            pt = FixedType.parse(param_type)
        except ValueError as e:
            raise FormatError(f"{e} ({what}: param_type)") from None
    if isinstance(fmt, RowwiseInt8) or fmt == ROWWISE:
        if pt is None:
            raise FormatError(f"{what}: int8_rowwise needs param_type (the scale/bias ap_fixed)")
        return RowwiseInt8(pt)
    if isinstance(fmt, FixedType):
        return fmt
    try:
        return FixedType.parse(fmt)
    except ValueError as e:
        raise FormatError(f"{e} ({what}: fmt, an ap_types type or {ROWWISE!r})") from None
