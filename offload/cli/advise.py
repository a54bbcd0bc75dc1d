"""``offload advise``: which parts of a model to offload to which card, at which batch sizes.

MODEL is a built-in example (``dlrm``, ``dlrm-small``, ``risk``) or ``package.module:factory``
where ``factory()`` returns ``(model, example_inputs)``.

    offload advise dlrm-small --batch-sizes 1,64,4096 --card u55c
    offload advise risk --launch persistent --card u55c
    offload advise mypkg.models:make_ranker --card u280 --json

Every row shows the card latency in both launch modes (per-call ``xrt::run``, and a persistent
kernel serving request slots in host memory, whose figures are MODELLED, not measured on a card);
``--launch`` says which one the verdicts use (``auto``, the default: the faster at each batch size).
"""

from __future__ import annotations

import importlib
import json
from typing import Any

import click

from offload.hls.cards import CARDS, LAUNCH_MODES

# torch, the examples and the advisor (which imports torch) stay inside the functions: importing
# torch takes ~5 s here, and every `offload ...` start-up imports this module.


def _builtin(name: str) -> tuple[Any, tuple]:
    import torch

    if name in ("dlrm", "dlrm-small"):
        from offload.examples import dlrm

        cfg = dlrm.DLRMConfig() if name == "dlrm" else dlrm.DLRMConfig.small()
        torch.manual_seed(0)
        return dlrm.DLRM(cfg).eval(), dlrm.make_clicks(cfg, 512, seed=1).inputs  # timing does not need training
    if name == "risk":
        from torch import nn

        from offload.examples.risk import make_transactions

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid()).eval()
        x, _ = make_transactions(256)
        return model, (torch.from_numpy(x),)
    raise click.BadParameter(f"unknown built-in model {name!r}; use dlrm, dlrm-small, risk or package.module:factory", param_hint="MODEL")


def _load(spec: str) -> tuple[Any, tuple]:
    if ":" not in spec:
        return _builtin(spec)
    mod, _, fn = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise click.BadParameter(f"{spec}: {e}", param_hint="MODEL") from None
    model, inputs = factory()
    return model, inputs if isinstance(inputs, tuple) else (inputs,)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected comma-separated integers", param_hint="--batch-sizes") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"{text!r}: batch sizes must be >= 1", param_hint="--batch-sizes")
    return sizes


@click.command("advise")
@click.argument("model", default="dlrm-small")
@click.option("--batch-sizes", default="1,64,4096", show_default=True, help="comma-separated batch sizes")
@click.option("--card", type=click.Choice(sorted(CARDS)), default="u55c", show_default=True)
@click.option("--ops", default="embedding_bag,embedding,mlp", show_default=True, help="candidate kinds")
@click.option("--fmt", default="ap_fixed<16,6>", show_default=True, help="table storage format")
@click.option("--reuse-factor", type=click.IntRange(min=1), default=1, show_default=True, help="MLP reuse factor")
@click.option("--rtl", "rtl_dirs", multiple=True, metavar="NAME=DIR",
              help="use the cycles and Yosys counts measured in MLP.to_rtl(DIR) for candidate NAME (repeatable)")
@click.option("--launch", type=click.Choice([*LAUNCH_MODES, "auto"]), default="auto", show_default=True,
              help="launch mode the verdicts use: per_call (an xrt::run a call), persistent (modelled: a running kernel "
                   "polling host-memory request slots) or auto (the faster at each batch size)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def advise_cmd(model: str, batch_sizes: str, card: str, ops: str, fmt: str, reuse_factor: int, rtl_dirs: tuple[str, ...],
               launch: str, as_json: bool) -> None:
    """Measure each offload candidate on its device, predict it on the card in both launch modes
    (persistent figures are modelled, not measured on a card), and say offload or keep."""
    from offload.advisor import advise
    from offload.hls.rtl import RtlSummary
    from offload.sim.errors import InputError

    sizes = _sizes(batch_sizes)
    rtl = {}
    for item in rtl_dirs:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"{item!r}: expected NAME=DIR", param_hint="--rtl")
        try:
            rtl[name] = RtlSummary.load(path)
        except InputError as e:
            raise click.BadParameter(str(e), param_hint="--rtl") from None
    m, inputs = _load(model)
    try:
        adv = advise(m, inputs, batch_sizes=sizes, card=card, ops=tuple(o.strip() for o in ops.split(",") if o.strip()),
                     fmt=fmt, reuse_factor=reuse_factor, rtl=rtl, launch=launch)
    except ValueError as e:
        if not rtl:
            raise
        raise click.BadParameter(str(e), param_hint="--rtl") from None
    if as_json:
        click.echo(json.dumps(adv.to_dict(), indent=1))
    else:
        click.echo(str(adv))
