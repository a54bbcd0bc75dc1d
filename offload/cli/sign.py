"""``offload sign`` and ``offload verify``: Ed25519 signatures of bundles (``offload.host.signing``)."""

from __future__ import annotations

import click

from offload.cli.build import load_bundle

__all__ = ["sign_cmd", "verify_cmd"]


@click.command("sign")
@click.argument("bundle", required=False, type=click.Path(exists=True, file_okay=False))
@click.option("--key", type=click.Path(exists=True, dir_okay=False), help="Ed25519 private key, PEM (PKCS#8, unencrypted).")
@click.option("--generate-key", type=click.Path(dir_okay=False), help="First write a new key pair: PATH (private, mode 0600) and PATH.pub.")
def sign_cmd(bundle: str | None, key: str | None, generate_key: str | None) -> None:
    """Sign BUNDLE: write its signature.json, an Ed25519 signature of its manifest digest.

    \b
    offload sign --generate-key release.pem             # release.pem and release.pem.pub
    offload sign model.offload --key release.pem
    offload verify model.offload --trusted-key release.pem.pub
    """
    from offload.host.bundle import sign
    from offload.host.signing import generate_key as generate, key_sha256, load_private_key

    if generate_key:
        private, public = generate(generate_key)
        click.echo(f"wrote {private} (private key, keep it secret) and {public} (public key, give it to whoever verifies)")
        key = key or str(private)
    if bundle is None:
        if generate_key:
            return
        raise click.UsageError("BUNDLE: give the bundle to sign (or only --generate-key PATH)")
    if key is None:
        raise click.UsageError("--key: give the Ed25519 private key to sign with")
    b = load_bundle(bundle, require_sealed=True)  # its refusals printed as `offload info` prints them
    path = sign(bundle, key)
    kid = key_sha256(load_private_key(key).public_key())
    click.echo(f"signed {bundle}: manifest sha256 {b.manifest_sha256}, key sha256 {kid} ({path.name})")


@click.command("verify")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--trusted-key", "trusted_keys", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="Ed25519 public key (PEM) whose signature is accepted; repeat for several.")
def verify_cmd(bundle: str, trusted_keys: tuple[str, ...]) -> None:
    """Load BUNDLE with every check a device load runs, and require a signature by a trusted key."""
    b = load_bundle(bundle, trusted_keys=list(trusted_keys))
    click.echo(f"verified {bundle}: manifest sha256 {b.manifest_sha256}, signed by key sha256 {b.signature_key}")
