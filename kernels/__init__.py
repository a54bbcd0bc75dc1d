"""Layer 2: what each offloadable kernel computes: specs, formats, validation, golden vectors and
the bundle format that carries them. Torch-free."""

from offload.kernels.registry import KINDS, Kernel, KernelKind, Registry, get_kind, kinds, register_kind, resident_copy

# The built-in kinds register themselves when their modules load.
from offload.kernels import embedding, mlp  # noqa: E402,F401  isort: skip

__all__ = ["KINDS", "Kernel", "KernelKind", "Registry", "get_kind", "kinds", "register_kind", "resident_copy"]
