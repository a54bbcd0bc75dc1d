"""Layer 1: fixed-point arithmetic with ap_fixed/ap_int semantics and bit-accurate reference models.

NumPy only: nothing here imports torch. The package's names are :mod:`offload.sim.fixed`'s.
"""

from .fixed import *  # noqa: F403
from .fixed import __all__  # noqa: F401
