"""TorchRec and FBGEMM modules in the partition passes.

A model that holds them has imported them, so their classes are looked up in ``sys.modules``; a
model without them never imports either library. The tracer keeps them whole (leaf modules: FX
cannot trace a KeyedJaggedTensor through them), and ``find`` turns them into candidates:

- ``ebc``: ``torchrec.EmbeddingBagCollection`` or ``torchrec.quant.EmbeddingBagCollection``, replaced
  by :class:`offload.nn.EmbeddingBagCollection` (every table in one call per pooling mode, whatever
  the model does with the KeyedTensor afterwards);
- ``tbe``: FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` / ``IntNBitTableBatchedEmbeddingBagsCodegen``,
  replaced by :meth:`offload.nn.TableBatchedEmbeddingBags.from_fbgemm` (a refusal, e.g. INT4 tables,
  becomes a "kept" row);
- anything else from torchrec's or FBGEMM's embedding modules (``FusedEmbeddingBagCollection``, ...)
  and ``torch.ops.fbgemm.*`` calls: a "kept" row saying why.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["FUNCTIONAL_ACTS", "module_kind", "leaf_types", "op_reason", "build", "describe"]

# Functional activations that join MLP chains as their module form (torchrec's Perceptron calls torch.relu).
FUNCTIONAL_ACTS: dict[Any, type] = {torch.relu: nn.ReLU, F.relu: nn.ReLU, torch.sigmoid: nn.Sigmoid, F.sigmoid: nn.Sigmoid,
                                    torch.tanh: nn.Tanh, F.tanh: nn.Tanh}

# (module, class name) -> kind; looked up only when the module is already imported.
_EBC = (("torchrec.modules.embedding_modules", "EmbeddingBagCollection"), ("torchrec.quant.embedding_modules", "EmbeddingBagCollection"))
_TBE = (("fbgemm_gpu.split_table_batched_embeddings_ops_training", "SplitTableBatchedEmbeddingBagsCodegen"),
        ("fbgemm_gpu.split_table_batched_embeddings_ops_inference", "IntNBitTableBatchedEmbeddingBagsCodegen"))
# Other embedding modules that must stay whole, with why they are kept.
_KEPT = ((("torchrec.modules.fused_embedding_modules", "FusedEmbeddingBagCollection"),
          "FusedEmbeddingBagCollection fuses the optimizer into training lookups; convert its tables with "
          "offload.nn.EmbeddingBagCollection.from_torchrec on an inference EmbeddingBagCollection"),
         (("torchrec.modules.embedding_modules", "EmbeddingCollection"),
          "EmbeddingCollection returns unpooled sequences (JaggedTensors): no offload kernel"),
         (("fbgemm_gpu.split_table_batched_embeddings_ops_training", "DenseTableBatchedEmbeddingBagsCodegen"),
          "DenseTableBatchedEmbeddingBagsCodegen: no offload loader (use SplitTableBatchedEmbeddingBagsCodegen)"))


def _classes(entries) -> tuple[type, ...]:
    out = []
    for mod_name, cls_name in entries:
        mod = sys.modules.get(mod_name)
        if mod is not None:
            out.append(getattr(mod, cls_name))
    return tuple(out)


def leaf_types() -> tuple[type, ...]:
    """The module classes the tracer keeps whole (those imported so far)."""
    return _classes(_EBC) + _classes(_TBE) + _classes([e for e, _ in _KEPT])


def module_kind(m: nn.Module) -> tuple[str | None, str]:
    """``("ebc" | "tbe", "")`` for a module offload can take, ``(None, why)`` for one it keeps,
    ``(None, "")`` for anything else."""
    if isinstance(m, _classes(_EBC)):
        return "ebc", ""
    if isinstance(m, _classes(_TBE)):
        return "tbe", ""
    for entry, why in _KEPT:
        cls = _classes([entry])
        if cls and isinstance(m, cls):
            return None, why
    return None, ""


def op_reason(target: Any) -> str:
    """Why a ``torch.ops.fbgemm.*`` call stays on the host ("" for any other call)."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) and str(target).startswith("fbgemm."):
        return f"FBGEMM op {target}: offload replaces FBGEMM's modules (TableBatchedEmbeddingBags.from_fbgemm), not its raw ops"
    return ""


def build(kind: str, m: nn.Module, fmt: str, device: Any, name: str, plan: Any = None) -> nn.Module:
    """The offload module standing for ``m`` (raises OffloadError subclasses on refusal); with a
    ``plan``, an EBC is sharded over its cards."""
    from offload.nn import EmbeddingBagCollection, ShardedEmbeddingBagCollection, TableBatchedEmbeddingBags

    if kind == "ebc" and plan is not None:
        return ShardedEmbeddingBagCollection.from_torchrec(m, plan, "local", fmt=fmt, device=device if isinstance(device, str) else getattr(device, "name", "sim"))
    if kind == "ebc":
        return EmbeddingBagCollection.from_torchrec(m, fmt=fmt, device=device)
    return TableBatchedEmbeddingBags.from_fbgemm(m, fmt=fmt, device=device, name=name)


def describe(kind: str, m: nn.Module) -> str:
    if kind == "ebc":
        cfgs = m.embedding_bag_configs()
        return f"{len(cfgs)} tables, {sum(len(c.feature_names) for c in cfgs)} features"
    return f"{len(m.embedding_specs)} tables, {len(m.feature_table_map)} features"
