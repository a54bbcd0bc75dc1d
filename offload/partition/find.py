"""Find offload candidates in a torch.fx graph (shared by ``offload.offload`` and ``offload.advise``).

A candidate is an ``nn.EmbeddingBag`` / ``nn.Embedding`` call, an ``F.embedding_bag`` call on a
parameter, or a maximal MLP chain: consecutive ``call_module`` nodes of supported layer types, each
feeding only the next, starting at a ``Linear``. Everything else is reported, never touched.

:func:`apply` is the first partition pass: it traces the model and gives every candidate and every
skipped node a report row. When the model is scored by AUC, a chain's trailing sigmoid that
computes the scored output stays on the host (:func:`split_scored_sigmoid`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from offload.partition import recsys
from offload.partition.report import Decision

if TYPE_CHECKING:  # state.py holds Candidate lists, so it imports this module, not the reverse
    from offload.partition.state import State

__all__ = ["Candidate", "apply", "find_candidates", "split_scored_sigmoid", "functional_args", "bag_inputs", "trace", "MLP_LAYERS", "OPS"]

OPS = ("embedding_bag", "embedding", "mlp")
# Layers the MLP kernel implements (Linear + element-wise activations; BatchNorm1d folds into the
# neighbouring Linear; Dropout and Identity are no-ops at inference).
MLP_LAYERS: tuple[type, ...] = (nn.Linear, nn.ReLU, nn.LeakyReLU, nn.Sigmoid, nn.Tanh, nn.BatchNorm1d, nn.Dropout, nn.Identity)


@dataclass
class Candidate:
    """One offloadable piece of the graph.

    ``nodes`` are the original graph nodes it replaces (a chain for MLPs, one node otherwise);
    ``module`` is the float module computing the same thing (a fresh ``nn.Sequential`` for chains,
    an ``nn.EmbeddingBag`` built from the parameter for functional calls).
    """

    kind: str
    nodes: list[fx.Node]
    module: nn.Module
    targets: list[str] = field(default_factory=list)
    functional: bool = False
    bag_mode: str | None = None
    per_sample_weights: bool = False

    @property
    def name(self) -> str:
        """The node's name, or ``first..last`` for a chain of several."""
        return self.nodes[0].name if len(self.nodes) == 1 else f"{self.nodes[0].name}..{self.nodes[-1].name}"

    @property
    def first(self) -> fx.Node:
        return self.nodes[0]

    @property
    def last(self) -> fx.Node:
        return self.nodes[-1]

    def describe(self) -> str:
        m = self.module
        if self.kind in ("ebc", "tbe"):
            return recsys.describe(self.kind, m)
        if isinstance(m, (nn.EmbeddingBag, nn.Embedding)):
            extra = f", mode={self.bag_mode}" if self.bag_mode else ""
            return f"{m.num_embeddings}x{m.embedding_dim}{extra}"
        layers = [type(x).__name__ for x in m]
        lin = [x for x in m if isinstance(x, nn.Linear)]
        sizes = [lin[0].in_features] + [x.out_features for x in lin] if lin else []
        return "->".join(map(str, sizes)) + f" ({'/'.join(layers)})"


class _Tracer(fx.Tracer):
    """FX's tracer, keeping TorchRec's and FBGEMM's embedding modules whole (see :mod:`.recsys`)."""

    def __init__(self) -> None:
        super().__init__()
        self._leaves = recsys.leaf_types()

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, self._leaves) or super().is_leaf_module(m, qualname)


def trace(model: nn.Module) -> fx.GraphModule:
    """``torch.fx.symbolic_trace`` with TorchRec/FBGEMM embedding modules as leaves (raises whatever
    FX raises for untraceable models)."""
    tracer = _Tracer()
    graph = tracer.trace(model)
    return fx.GraphModule(tracer.root, graph, model.__class__.__name__)


def _mlp_type(m: nn.Module) -> bool:
    return type(m) in MLP_LAYERS


def _chain_layer(node: fx.Node, mods: dict) -> nn.Module | None:
    """The MLP layer ``node`` computes (a copy), or None: a supported module, or a functional activation."""
    if node.op == "call_module" and _mlp_type(mods[node.target]):
        return copy.deepcopy(mods[node.target])
    if node.op == "call_function" and node.target in recsys.FUNCTIONAL_ACTS and not node.kwargs:
        return recsys.FUNCTIONAL_ACTS[node.target]()
    return None


def _single_input(node: fx.Node, prev: fx.Node | None = None) -> bool:
    if node.kwargs or len(node.args) != 1 or not isinstance(node.args[0], fx.Node):
        return False
    return prev is None or node.args[0] is prev


# F.embedding_bag's parameters in positional order (torch.nn.functional.embedding_bag).
EMB_BAG_PARAMS = ("input", "weight", "offsets", "max_norm", "norm_type", "scale_grad_by_freq", "mode", "sparse",
                   "per_sample_weights", "include_last_offset", "padding_idx")


def functional_args(node: fx.Node) -> dict[str, Any]:
    """An ``F.embedding_bag`` call's arguments by name, however they were passed."""
    out = dict(zip(EMB_BAG_PARAMS, node.args))
    out.update(node.kwargs)
    return out


def bag_inputs(c: Candidate) -> tuple[Any, Any]:
    """The (input, offsets) arguments of a bag candidate's call, module or functional."""
    n = c.first
    if c.functional:
        a = functional_args(n)
        return a["input"], a.get("offsets")
    inp = n.args[0] if n.args else n.kwargs["input"]
    off = n.args[1] if len(n.args) > 1 else n.kwargs.get("offsets")
    return inp, off


def _bag_from_functional(gm: fx.GraphModule, node: fx.Node) -> tuple[nn.EmbeddingBag | None, str]:
    """A float ``nn.EmbeddingBag`` equivalent to an ``F.embedding_bag`` call, or ``(None, why)``."""
    a = functional_args(node)
    weight = a.get("weight")
    if not (isinstance(weight, fx.Node) and weight.op == "get_attr"):
        return None, "F.embedding_bag weight is not a module parameter (computed at run time)"
    if a.get("max_norm") is not None:
        return None, f"F.embedding_bag with max_norm={a['max_norm']!r} renormalises rows at lookup time: no offload kernel"
    for key in ("mode", "padding_idx", "include_last_offset"):
        if isinstance(a.get(key), fx.Node):
            return None, f"F.embedding_bag's {key} is computed at run time"
    w = _get_attr(gm, weight.target)
    bag = nn.EmbeddingBag.from_pretrained(w.detach().clone(), freeze=True, mode=a.get("mode", "mean"),
                                          include_last_offset=bool(a.get("include_last_offset", False)),
                                          padding_idx=a.get("padding_idx"))
    return bag, ""


def _get_attr(gm: fx.GraphModule, target: str) -> torch.Tensor:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class Skipped:
    """A node that looks like an op the user asked for but cannot be offloaded as is."""

    node: fx.Node
    kind: str
    reason: str
    module: nn.Module | None = None


def find_candidates(gm: fx.GraphModule, ops: tuple[str, ...] = OPS) -> tuple[list[Candidate], list[Skipped]]:
    """Candidates in graph order, and the nodes that were considered but skipped (with why)."""
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise ValueError(f"ops: unknown {bad}; supported: {list(OPS)}")
    mods = dict(gm.named_modules())
    cands: list[Candidate] = []
    skipped: list[Skipped] = []
    used: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node in used:
            continue
        if node.op == "call_function" and node.target is F.embedding_bag:
            if "embedding_bag" not in ops:
                continue
            bag, why = _bag_from_functional(gm, node)
            if bag is None:
                skipped.append(Skipped(node, "embedding_bag", why))
                continue
            fa = functional_args(node)
            cands.append(Candidate("embedding_bag", [node], bag, [str(fa["weight"].target)],
                                   functional=True, bag_mode=bag.mode, per_sample_weights=fa.get("per_sample_weights") is not None))
            continue
        if node.op == "call_function" and recsys.op_reason(node.target):
            skipped.append(Skipped(node, "fbgemm_op", recsys.op_reason(node.target)))
            continue
        if node.op != "call_module":
            continue
        mod = mods[node.target]
        kind, why = recsys.module_kind(mod)
        if kind is not None:
            if "embedding_bag" in ops:
                cands.append(Candidate(kind, [node], mod, [node.target]))
            continue
        if why:
            skipped.append(Skipped(node, type(mod).__name__, why, mod))
            continue
        if isinstance(mod, nn.EmbeddingBag):
            if "embedding_bag" in ops:
                psw = len(node.args) > 2 or node.kwargs.get("per_sample_weights") is not None
                cands.append(Candidate("embedding_bag", [node], mod, [node.target], bag_mode=mod.mode, per_sample_weights=psw))
            continue
        if isinstance(mod, nn.Embedding):
            if "embedding" in ops:
                cands.append(Candidate("embedding", [node], mod, [node.target]))
            continue
        if "mlp" in ops and isinstance(mod, nn.Linear) and type(mod) is nn.Linear:
            if not _single_input(node):
                skipped.append(Skipped(node, "mlp", "Linear called with more than one input", mod))
                continue
            chain = [node]
            layers = [copy.deepcopy(mod)]
            cur = node
            while len(cur.users) == 1:
                nxt = next(iter(cur.users))
                layer = _chain_layer(nxt, mods) if _single_input(nxt, cur) else None
                if layer is None:
                    break
                chain.append(nxt)
                layers.append(layer)
                cur = nxt
            used.update(chain)
            seq = nn.Sequential(*layers).eval()
            cands.append(Candidate("mlp", chain, seq, [n.target if n.op == "call_module" else n.target.__name__ for n in chain]))
            continue
        if not _mlp_type(mod):
            skipped.append(Skipped(node, type(mod).__name__, f"no offload kernel for {type(mod).__name__}", mod))
    return cands, skipped


# Calls that only reshape a tensor: a value reaching the output through them is the output's values.
_SHAPE_METHODS = ("squeeze", "unsqueeze", "view", "reshape", "flatten")
_SHAPE_FUNCTIONS = (torch.squeeze, torch.unsqueeze, torch.reshape, torch.flatten)
SCORE_SIGMOID_REASON = (
    "kept on the host under an AUC budget: the sigmoid on the scored output is strictly increasing, so on "
    "the host it keeps the offloaded logit's order (all AUC reads); on the card its table would tie confident scores")


def _is_scored_output(node: fx.Node) -> bool:
    """Whether ``node``'s values, at most reshaped, are the model's first output tensor and go nowhere else."""
    while len(node.users) == 1:
        nxt = next(iter(node.users))
        if nxt.op == "output":
            leaves = pytree.tree_leaves(nxt.args[0])
            return bool(leaves) and leaves[0] is node
        shape_op = ((nxt.op == "call_method" and nxt.target in _SHAPE_METHODS)
                    or (nxt.op == "call_function" and nxt.target in _SHAPE_FUNCTIONS))
        if not shape_op or not nxt.args or nxt.args[0] is not node:
            return False
        node = nxt
    return False


def split_scored_sigmoid(cands: list[Candidate], mods: dict) -> list[Skipped]:
    """Take a trailing sigmoid off every MLP chain whose sigmoid computes the model's scored output.

    For a model scored by AUC: the sigmoid is strictly increasing, so the float sigmoid on the host
    of the chain's fixed-point logit ranks rows exactly as the logit does; on the card it would be a
    lookup table whose step ties confident scores. The chain then ends at the logit (what hls4ml
    users deploy) and the sigmoid's row says why it stayed. float32's own sigmoid can still tie two
    logits once ``sigmoid(x)`` is within 2**-24 of 1 (x > 16.6), far past any table's resolution.
    """
    kept = []
    for c in cands:
        if c.kind != "mlp" or len(c.nodes) < 2 or not isinstance(c.module[-1], nn.Sigmoid) or not _is_scored_output(c.last):
            continue
        sig = c.nodes.pop()
        c.module = nn.Sequential(*list(c.module)[:-1]).eval()
        c.targets.pop()
        kept.append(Skipped(sig, "sigmoid", SCORE_SIGMOID_REASON, mods.get(sig.target) if sig.op == "call_module" else None))
    return kept


def apply(st: State) -> None:
    """Pass: trace ``st.model`` (a failure lands in ``st.trace_error``) and list its candidates, each
    with a report row, then the skipped nodes, each with a "kept" row saying why. When the holdout
    is scored by AUC (an ``auc_drop`` budget, or labels without a budget) a sigmoid computing the
    scored output stays on the host (:func:`split_scored_sigmoid`)."""
    try:
        st.gm = trace(st.model)
    except Exception as e:  # noqa: BLE001 - FX raises many types (TraceError, TypeError, RuntimeError...)
        st.trace_error = e
        return
    st.candidates, st.skipped = find_candidates(st.gm, st.ops)
    if st.holdout is not None and st.holdout.metric == "auc_drop":
        st.skipped += split_scored_sigmoid(st.candidates, dict(st.gm.named_modules()))
    for c in st.candidates:
        st.decisions[c.name] = Decision(c.name, c.kind, ",".join(c.targets), c.describe(), False, "")
        st.report.decisions.append(st.decisions[c.name])
    for s in st.skipped:
        target = str(s.node.target) if s.node.op == "call_module" or s.kind == "fbgemm_op" else "F." + s.node.target.__name__
        st.report.decisions.append(Decision(s.node.name, s.kind, target, "", False, s.reason))
