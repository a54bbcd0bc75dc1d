"""The one error hierarchy: every error offload raises on purpose is an :class:`OffloadError`.

It lives in the lowest layer so that every layer above raises from the same tree. Each class also
derives from the builtin a caller would catch for the same mistake (``ValueError`` for a bad
value, ``IndexError`` for an index out of range, ``RuntimeError`` for a device failure), so
``except ValueError`` code keeps working while ``except offload.OffloadError`` catches them all.

Example::

    from offload.sim.errors import InputError
    raise InputError("offsets: must be non-decreasing; offsets[3]=7 > offsets[4]=5")
"""

from __future__ import annotations

__all__ = [
    "OffloadError",
    "FormatError",
    "InputError",
    "InputIndexError",
    "InputTypeError",
    "InputKeyError",
    "IndexRangeError",
    "OffsetsError",
    "IndexDtypeError",
    "PerSampleWeightsDtypeError",
    "FormatOverflowError",
    "FormatOverflowWarning",
    "UnsupportedError",
    "BundleError",
    "DeviceError",
    "DeviceTimeout",
    "ToolError",
    "BuildError",
    "CSimError",
    "ToolchainMissing",
    "ReportError",
    "GoldenError",
]


class OffloadError(Exception):
    """Base of every error offload raises on purpose (a programming bug is never one)."""


class FormatError(OffloadError, ValueError):
    """A fixed-point type or table format that cannot be parsed or is not supported."""


class InputError(OffloadError, ValueError):
    """A call's inputs break the kernel's contract; the message names the field and the limit."""


class InputIndexError(OffloadError, IndexError):
    """An index outside its table (or another bound); names the field, the value and the limit."""


class InputTypeError(OffloadError, TypeError):
    """An input of the wrong type or dtype; names the field, what came and what is accepted."""


class InputKeyError(OffloadError, KeyError):
    """A name that is not among those the call knows (a layer, a role, a table); lists the known ones."""

    def __str__(self) -> str:  # KeyError would print the message quoted, as a repr
        return str(self.args[0]) if self.args else ""


# The torch-compatible refinements: a drop-in module must raise what torch raises for the same
# input (RuntimeError from ATen's TORCH_CHECK in aten/src/ATen/native/EmbeddingBag.cpp, torch
# 2.13) while staying catchable as offload's own documented type.


class IndexRangeError(InputIndexError, RuntimeError):
    """An index outside its table: ``IndexError`` for Python code, ``RuntimeError`` as torch's
    ``embedding_bag`` raises ("Expected idx >= 0 && idx < num_embeddings")."""


class OffsetsError(InputError, RuntimeError):
    """Offsets that break the bag layout (start, order, end): ``ValueError`` and, as torch raises
    for the same offsets, ``RuntimeError``."""


class IndexDtypeError(InputTypeError, RuntimeError):
    """Indices or offsets of a dtype the lookup cannot take: ``TypeError`` and, as torch raises,
    ``RuntimeError``."""


class PerSampleWeightsDtypeError(InputTypeError, RuntimeError):
    """``per_sample_weights`` whose dtype differs from the table's where torch refuses it
    ("have the same type as"): ``TypeError`` and ``RuntimeError``."""


class FormatOverflowError(InputError, OverflowError):
    """Values a fixed-point format cannot hold (a table at conversion with ``on_overflow="raise"``,
    per-sample weights outside ``weight_type``); names the count, the worst value and the range."""


class FormatOverflowWarning(UserWarning):
    """Values saturated to a format's range (the ``on_overflow="warn"`` default); the message gives
    the count, the worst value and the range, so the damage is never silent."""


class UnsupportedError(OffloadError, NotImplementedError):
    """A model, layer or option the kernels cannot implement (the partitioner keeps it on host)."""


class BundleError(OffloadError, ValueError):
    """A bundle on disk that is missing, malformed, tampered with or inconsistent with its specs."""


class DeviceError(OffloadError, RuntimeError):
    """A device failed to run a kernel (bad state, lost card, build error)."""


class DeviceTimeout(DeviceError):
    """A kernel run did not finish within its timeout."""


class ToolError(OffloadError, RuntimeError):
    """An external tool (g++, Vitis HLS, v++) failed or is missing."""


class BuildError(ToolError):
    """A Vitis project or xclbin build failed."""


class CSimError(ToolError):
    """A C-simulation build or run failed."""


class ToolchainMissing(CSimError):
    """A compiler or tool the C-simulation needs is not installed."""


class ReportError(OffloadError, ValueError):
    """A synthesis report that cannot be parsed."""


class GoldenError(OffloadError, RuntimeError):
    """Committed golden vectors that disagree with the reference or the C-simulation."""
