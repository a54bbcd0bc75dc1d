"""Layer 1: fixed-point arithmetic with ap_fixed/ap_int semantics and bit-accurate reference models.

NumPy only: nothing here imports torch.
"""

from .fixed import (
    OVERFLOW_MODES,
    ROUNDING_MODES,
    FixedType,
    accumulate,
    add,
    add_type,
    mul,
    mul_type,
    sub,
    sub_type,
)

__all__ = [
    "FixedType",
    "ROUNDING_MODES",
    "OVERFLOW_MODES",
    "add",
    "sub",
    "mul",
    "add_type",
    "sub_type",
    "mul_type",
    "accumulate",
]
