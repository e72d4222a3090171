"""key: the Ed25519 keys publishers sign manifests with and readers trust (docs/security.md)."""

from __future__ import annotations

from pathlib import Path

import click

from neffcache.signing import PublicKey, generate

from .output import json_option, render


@click.group("key")
def key_group() -> None:
    """Signing keys: a publisher signs what it publishes, readers trust its public key.

    \b
    Example:
      neffcache key generate /etc/neffcache/ci-main      # writes ci-main (0600) and ci-main.pub
      NEFFCACHE_SIGNING_KEY=/etc/neffcache/ci-main neffcache warm ...
      NEFFCACHE_TRUSTED_KEYS=/etc/neffcache/ci-main.pub neffcache verify s3://bucket/cache --require-signed
    """


@key_group.command("generate")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@json_option
def generate_cmd(path: Path, as_json: bool) -> None:
    """Write a new key pair: PATH (the private key, mode 0600) and PATH.pub, and print the public key.

    Never overwrites a key: an existing PATH or PATH.pub is an error. Keep PATH where only the
    publisher (a CI runner of main, say) can read it; hand PATH.pub to every reader.

    \b
    Example:
      neffcache key generate ./ci-main
    """
    key_id, line = generate(path)
    render(as_json, {"private": str(path), "public": f"{path}.pub", "key_id": key_id, "public_key": line},
           lambda: f"wrote {path} (private, 0600) and {path}.pub\nkey id {key_id}\n{line}")


@key_group.command("show")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@json_option
def show_cmd(path: Path, as_json: bool) -> None:
    """Print a public key file's key id (what manifests and trust settings name it by).

    \b
    Example:
      neffcache key show /etc/neffcache/ci-main.pub
    """
    public = PublicKey.load(path)
    render(as_json, {"public": str(path), "key_id": public.id}, lambda: f"{path}: key id {public.id}")


COMMANDS = [key_group]
