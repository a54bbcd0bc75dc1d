"""``offload serve``: the scoring service over a bundle (OIP v2), on uvicorn or Ray Serve."""

from __future__ import annotations

from pathlib import Path

import click

from offload.hls.cards import LAUNCH_CHOICES

__all__ = ["serve_cmd"]


@click.command("serve")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless told otherwise).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="TCP port (0: the OS picks one).")
@click.option("--grpc-port", default=None, type=click.IntRange(0, 65535), help="Also serve OIP v2 over gRPC on this port (Triton's is 8001) [default: off].")
@click.option("--grpc-max-streams", default=32, show_default=True, type=int, help="Concurrent streams per gRPC connection.")
@click.option("--device", default="sim", show_default=True, help="sim | emu | xrt:N | pynq:N")
@click.option("--launch", type=click.Choice(LAUNCH_CHOICES), default="auto", show_default=True, help="Kernel start: a run per batch, or started once and fed through a ring (auto: where the device offers it).")
@click.option("--max-batch-size", default=64, show_default=True, type=int, help="Rows per device call.")
@click.option("--max-queue-delay-us", default=100, show_default=True, type=int, help="Longest wait for a fuller batch.")
@click.option("--max-queue-size", default=1024, show_default=True, type=int, help="Queued requests beyond this get 503.")
@click.option("--api-key", default=None, envvar="OFFLOAD_API_KEY", help="Require 'Authorization: Bearer KEY' (also $OFFLOAD_API_KEY).")
@click.option("--fallback", type=click.Choice(["sim", "503"]), default="sim", show_default=True, help="On a device fault: re-run on the sim device, or answer 503.")
@click.option("--request-timeout-ms", default=1000.0, show_default=True, type=float, help="Requests not answered by then get 504.")
@click.option("--device-timeout-ms", default=1000.0, show_default=True, type=float, help="A device call past this is a fault (abandoned past 1.1x + 50 ms).")
@click.option("--header-timeout-s", default=10.0, show_default=True, type=float, help="A request head not received by then closes the connection.")
@click.option("--body-timeout-s", default=30.0, show_default=True, type=float, help="A request body not received by then closes the connection.")
@click.option("--max-connections", default=None, type=int, help="Open connections before the longest-idle is closed for a new one [default: open-file limit - 64].")
@click.option("--drain-timeout-s", default=30.0, show_default=True, type=float, help="On SIGTERM, how long requests already read may take to be answered.")
@click.option("--require-sealed", is_flag=True, help="Refuse a bundle without a manifest digest (format version 1) instead of warning.")
@click.option("--trusted-key", "trusted_keys", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Serve only a bundle signed by this Ed25519 public key (PEM); repeat for several.")
@click.option("--ray", "use_ray", is_flag=True, help="Deploy with Ray Serve instead (one replica per card).")
@click.option("--replicas", default=1, show_default=True, type=int, help="Ray Serve replicas.")
@click.option("--ray-resource", default="fpga", show_default=True, help="Ray custom resource that marks a host's cards.")
@click.option("--log-level", default="warning", show_default=True, type=click.Choice(["critical", "error", "warning", "info", "debug", "trace"], case_sensitive=False))
def serve_cmd(bundle, host, port, grpc_port, grpc_max_streams, device, launch, max_batch_size, max_queue_delay_us, max_queue_size, api_key, fallback, request_timeout_ms, device_timeout_ms, header_timeout_s, body_timeout_s, max_connections, drain_timeout_s, require_sealed, trusted_keys, use_ray, replicas, ray_resource, log_level):
    """Serve BUNDLE over the Open Inference Protocol v2 (KServe/Triton HTTP/REST, and gRPC with --grpc-port)."""
    from offload.serve.config import ServeConfig
    from offload.serve.errors import ConfigError

    try:
        cfg = ServeConfig(
            device=device,
            launch=launch,
            max_batch_size=max_batch_size,
            max_queue_delay_us=max_queue_delay_us,
            max_queue_size=max_queue_size,
            request_timeout_ms=request_timeout_ms,
            device_timeout_ms=device_timeout_ms,
            fallback=fallback,
            api_key=api_key,
            header_timeout_s=header_timeout_s,
            body_timeout_s=body_timeout_s,
            max_connections=max_connections,
            drain_timeout_s=drain_timeout_s,
            grpc_max_streams=grpc_max_streams,
        )
    except ConfigError as e:
        raise click.BadParameter(str(e)) from None
    if use_ray:
        if grpc_port is not None:
            raise click.BadParameter("--grpc-port: not available with --ray (Ray Serve's proxy serves HTTP)")
        if require_sealed or trusted_keys:
            raise click.BadParameter("--require-sealed/--trusted-key: not available with --ray (each replica loads the bundle path itself)")
        from offload.serve.ray_serve import run_ray

        run_ray(str(Path(bundle).resolve()), cfg, replicas=replicas, resource=ray_resource, host=host, port=port)
        return
    from offload.cli.build import load_bundle
    from offload.serve.server import serve

    b = load_bundle(bundle, require_sealed=require_sealed, trusted_keys=list(trusted_keys) or None)
    grpc_note = f" and grpc://{host}:{grpc_port}" if grpc_port is not None else ""
    click.echo(f"offload serve: {bundle} on http://{host}:{port}{grpc_note} (device {device}, max batch {max_batch_size}, delay {max_queue_delay_us} us)", err=True)
    serve(b, cfg, host=host, port=port, grpc_port=grpc_port, log_level=log_level)
