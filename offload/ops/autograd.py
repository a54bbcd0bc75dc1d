"""Autograd for the offload ops: they are inference-only, and say so at ``backward()``.

Without a rule, an op registered under CompositeExplicitAutograd returns outputs that claim
``requires_grad=True`` when an input requires grad, and ``backward()`` then "succeeds" with every
``.grad`` left None: training code would silently stop learning through the offloaded layer. A
registered backward that raises turns that into a clear error at the first ``backward()``.

Cost per call: ``torch.library.register_autograd``'s kernel redispatches below autograd through
Python even when nothing needs a gradient (a second trip through the dispatcher, ~4 us of a ~30 us
embedding lookup). Given ``direct`` (the op's CPU implementation), the kernel registered here calls
it straight away when that is all the redispatch could reach: grad mode off or no input requiring
grad, and the call's dispatch keys below autograd exactly those of a plain CPU tensor (no fake,
functional or meta tensor, no Python dispatch mode, no other device). Every other call takes
register_autograd's own kernel, unchanged.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch._library.autograd import Info, make_autograd_impl

from offload.sim.errors import UnsupportedError

__all__ = ["register_inference_only"]

# The keys a plain dense CPU call hands the autograd kernel are {CPU, AutogradCPU} (probed on 2.13:
# a fake tensor or a dispatch mode adds Python, a CUDA tensor gives CUDA); below autograd that is
# {CPU}, which leads straight to the CompositeExplicitAutograd kernel.
_PLAIN_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU).raw_repr()


def register_inference_only(qualname: str, lib: torch.library.Library, direct: Optional[Callable[..., Any]] = None,
                            shown: Optional[str] = None) -> None:
    """Register a backward for ``qualname`` (``"offload::mlp_score"``) that raises UnsupportedError.

    ``direct``: the op's CompositeExplicitAutograd implementation, to skip the redispatch on plain
    CPU calls that need no gradient (see the module docstring). ``shown``: the op the error names
    (an implementation op, ``offload::_embedding_lookup_py``, names the public one).
    """

    def backward(ctx: Any, *grads: Any) -> Any:
        raise UnsupportedError(
            f"{shown or qualname} is not differentiable: offload kernels are inference-only (quantized, "
            "fixed-point, on a card); train the float model, then convert it with from_float / offload.offload"
        )

    if direct is None:
        torch.library.register_autograd(qualname, backward, lib=lib)
        return
    # What torch.library.register_autograd builds and registers (torch/library.py and
    # torch/_library/autograd.py at v2.13.0: make_autograd_impl, then lib.impl(name, kernel,
    # "Autograd", with_keyset=True)); its checks (functional schema, no out variant, no kwarg-only
    # tensors) hold for every offload op's schema.
    ns, name = qualname.split("::")
    op = getattr(getattr(torch.ops, ns), name).default
    slow = make_autograd_impl(op, Info(backward, None))
    after_autograd = torch._C._after_autograd_keyset
    grad_enabled = torch._C.is_grad_enabled
    any_requires_grad = torch._C._any_requires_grad

    def kernel(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        if (keyset & after_autograd).raw_repr() == _PLAIN_CPU and not (grad_enabled() and any_requires_grad(*args)):
            return direct(*args)
        return slow(keyset, *args)

    lib.impl(name, kernel, "Autograd", with_keyset=True)
