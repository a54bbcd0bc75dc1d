"""What the service serves: one kernel of a bundle, its tensor names and widths, its input check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from offload.host.bundle import Bundle
from offload.kernels import Kernel
from offload.kernels.mlp import MlpSpec, validate_inputs
from offload.serve.types import TensorSpec
from offload.sim.errors import BundleError, UnsupportedError

__all__ = ["ServedModel", "served_model"]


@dataclass(frozen=True)
class ServedModel:
    """The bundle's scoring kernel as an OIP model (input ``x`` [B, F], output ``y`` [B, n_out])."""

    name: str
    kernel: Kernel
    input: TensorSpec
    output: TensorSpec
    meta: dict
    version: str = "1"

    def validate(self, x: np.ndarray) -> None:
        """The kernel kind's own input check (NaN, infinity, range), before any queueing. Only the
        input half (``validate_inputs``): the resident tensors are the bundle's, checked once at load."""
        validate_inputs(self.kernel.spec, {"x": x})

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": f"offload_{self.kernel.kind}",
            "inputs": [self.input.metadata()],
            "outputs": [self.output.metadata()],
        }


def served_model(bundle: Bundle) -> ServedModel:
    """Picks the kernel to serve from a bundle (``offload.load(path)``): its only kernel, else the
    kernel named like the bundle.

    Example::

        m = served_model(offload.load("risk_bundle"))
        m.name, m.input.width          # ("risk", 16)
    """
    kernels: dict[str, Kernel] = dict(bundle.kernels)
    if len(kernels) == 1:
        (kernel,) = kernels.values()
    elif bundle.name in kernels:
        kernel = kernels[bundle.name]
    else:
        raise BundleError(f"bundle {bundle.name!r} holds kernels {sorted(kernels)}; the service needs one, or one named {bundle.name!r}")
    if not isinstance(kernel.spec, MlpSpec):
        raise UnsupportedError(f"kernel {kernel.name!r} is of kind {kernel.kind!r}; the scoring service serves mlp kernels")
    spec = kernel.spec
    return ServedModel(bundle.name, kernel, TensorSpec("x", spec.n_features), TensorSpec("y", spec.n_outputs), dict(bundle.meta))
