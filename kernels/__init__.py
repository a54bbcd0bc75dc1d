"""Layer 2: what each offloadable kernel computes: specs, formats, validation, golden vectors and
the bundle format that carries them. Torch-free."""

from offload.kernels.registry import Kernel, KernelKind, get_kind, kinds, register_kind, resident_copy

__all__ = ["Kernel", "KernelKind", "get_kind", "kinds", "register_kind", "resident_copy"]
