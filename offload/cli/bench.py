"""``offload bench``: open-loop constant-rate load against a running service."""

from __future__ import annotations

import asyncio

import click

__all__ = ["bench_cmd"]


@click.command("bench")
@click.argument("url")
@click.option("--rate", required=True, type=float, help="Requests per second (constant, open loop).")
@click.option("--duration", required=True, type=float, help="Seconds of load.")
@click.option("--batch", default=1, show_default=True, type=int, help="Rows per request.")
@click.option("--model", default=None, help="Model name, when URL is just http://HOST:PORT.")
@click.option("--api-key", default=None, envvar="OFFLOAD_API_KEY")
@click.option("--out", default="offload-bench", show_default=True, help="Writes OUT.json and OUT.png.")
def bench_cmd(url, rate, duration, batch, model, api_key, out):
    """Open-loop load on URL (http://127.0.0.1:PORT/v2/models/NAME): latency percentiles and throughput."""
    # Imported here: the load generator pulls in aiohttp and the service's stack (~0.35 s of
    # `offload --help`, measured with -X importtime).
    from offload.loadgen import run_load, write_report

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        res = asyncio.run(run_load(url, rate, duration, batch=batch, model=model, headers=headers))
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    except RuntimeError as e:
        raise click.ClickException(str(e)) from None
    write_report(res, f"{out}.json", f"{out}.png")
    click.echo(res.summary())
    click.echo(f"  wrote {out}.json and {out}.png")
