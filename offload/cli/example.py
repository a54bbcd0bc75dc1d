"""``offload example``: train an example model and write its bundle."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["example_cmd"]


@click.command("example")
@click.argument("name", type=click.Choice(["risk"]))
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--seed", default=0, show_default=True, type=int)
def example_cmd(name, out, seed):
    """Train and write an example bundle (``risk``: a transaction-risk MLP) to OUT."""
    # Fail on an unusable OUT before a minute of training, not after.
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    # torch (about a second to import) only when the command runs, not for `offload --help`.
    from offload.examples.risk import build_risk_bundle

    b = build_risk_bundle(out, seed=seed)
    m = b.meta
    click.echo(f"wrote {out}: model {b.name!r}, {len(m['features'])} features, AUC float {m['auc_float']:.4f}, quantized {m['auc_quantized']:.4f}")
