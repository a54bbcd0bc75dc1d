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
