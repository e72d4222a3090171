"""Commands on one cache root: verify, env, config (scan: cli/scan.py)."""

from __future__ import annotations

import dataclasses
import sys

import click

from neffcache.application.config import job_toolchain, load_settings
from neffcache.application.jobenv import job_env, render_env
from neffcache.application.trusted import trust_policy
from neffcache.operations.verify import CheckStatus, VerifyReport, verify
from neffcache.stores import open_store

from .errors import CORRUPT, SOME_ENTRIES_FAILED, UNTRUSTED, announce_index
from .options import (
    chosen_layouts,
    endpoint_option,
    index_options,
    layout_option,
    open_settings_index,
    store_options,
    toolchain_options,
)
from .output import json_option, progress, render, toml_lines


def _verify_text(report: VerifyReport) -> str:
    out = [f"{report.store}: {report.count(CheckStatus.OK)} ok, {report.count(CheckStatus.CORRUPT)} corrupt, "
           f"{report.count(CheckStatus.UNVERIFIED)} without manifest (written by a runtime; "
           f"`neffcache pull` computes one) in {report.seconds:.1f}s"]
    for c in report.corrupt:
        where = f" -> quarantined to {c.quarantined_to}" if c.quarantined_to else ""
        where += f" ({c.error})" if c.error else ""
        out.append(f"CORRUPT {c.path}: {'; '.join(c.problems)}{where}")
    verdicts = report.verdicts()
    if verdicts:
        out.append("signatures: " + ", ".join(f"{n} {v}" for v, n in verdicts.items())
                   + ("" if "unsigned" not in verdicts else " (--require-signed refuses unsigned entries)"))
    for c in report.checks:
        if c.status is CheckStatus.FAILED:
            out.append(f"FAILED {c.path}: {'; '.join(c.problems)}")
        elif c.status is CheckStatus.REFUSED:
            out.append(f"REFUSED {c.path}: {'; '.join(c.problems)}")
        elif c.status is CheckStatus.MISMATCH:
            out.append(f"MISMATCH {c.path}: {'; '.join(c.problems)}")
        elif c.status is CheckStatus.UNVERIFIED and c.problems:
            out.append(f"WARNING {c.path} (written by a runtime, kept): {'; '.join(c.problems)}")
    out.extend(f"NOT CHECKED {problem}" for problem in report.listing_problems)
    if report.listing_problems:
        out.append(f"{len(report.listing_problems)} part(s) of the store could not be listed: what they hold "
                   "was not verified")
    return "\n".join(out)


@click.command("verify")
@click.argument("store_url", metavar="STORE")
@click.option("--fix", is_flag=True, help="Quarantine corrupt entries (moved under .neffcache/quarantine/).")
@click.option("--require-signed/--no-require-signed", default=None,
              help="Refuse entries no trusted key signed (default: NEFFCACHE_REQUIRE_SIGNED; keys: "
                   "NEFFCACHE_TRUSTED_KEYS).")
@index_options
@endpoint_option
@json_option
def verify_cmd(store_url: str, fix: bool, require_signed: bool | None, index_url: str | None, token: str | None,
               as_json: bool) -> None:
    """Check every entry's files against the sha256 digests in its manifest, who signed it, and
    whether its own inputs match its namespace.

    Exits 5 when corrupt entries remain (quarantined ones with --fix do not count), 15 when
    entries whose files match are refused by the trust policy (a bad, revoked or out-of-scope
    signature; unsigned under --require-signed) or contradict their namespace (a --target=trn1
    entry in a trn2 namespace, a manifest the index says was lost), else 1 when some entries
    could not be checked (unreadable, badly named: listed as FAILED) or part of the store could
    not be listed (a symlinked or unreadable directory: NOT CHECKED). Refused entries are
    reported, never quarantined. With an
    index server configured, each corrupt entry is reported there as an error, and each
    quarantined one as evicted from STORE.

    \b
    Example:
      neffcache verify fsx:///mnt/fsx/neuron-cache --fix
      NEFFCACHE_TRUSTED_KEYS=ci.pub neffcache verify s3://bucket/cache --require-signed
    """
    settings = load_settings(index_url=index_url, token=token)
    policy = trust_policy(settings, require_signed=require_signed)
    index = open_settings_index(settings)
    try:
        store = open_store(store_url, create=False, read_only=not fix, **store_options(settings))
        try:
            with progress("verifying", enabled=not as_json) as bar:
                report = verify(store, fix=fix, progress=bar.update, index=index, policy=policy)
        finally:
            store.close()
    finally:
        index.close()
    data = report.to_json()
    if index.enabled:
        data["index"] = index.counts().to_json()
    render(as_json, data, lambda: _verify_text(report))
    announce_index(index, [store_url])
    if any(c.quarantined_to is None for c in report.corrupt):
        sys.exit(CORRUPT)
    if report.untrusted:
        sys.exit(UNTRUSTED)
    if report.failed or report.listing_problems:
        sys.exit(SOME_ENTRIES_FAILED)


@click.command("env")
@toolchain_options
@click.option("--store", "store_url", metavar="URL", help="The shared cache (default: NEFFCACHE_STORES' first).")
@layout_option("Which runtime's variables to print.")
@click.option("--local", "local_root", metavar="DIR",
              help="Node-local directory for runtimes that keep a local tier beside the shared cache (vLLM-Neuron's "
                   "VLLM_CACHE_ROOT); never inside the store (default: NEFFCACHE_LOCAL_ROOT, else "
                   "/var/tmp/neffcache-local).")
@click.option("--shell", type=click.Choice(["bash", "fish", "json"]), default="bash", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="The same as --shell json: toolchain, env and notes as JSON.")
def env_cmd(instance: str | None, lnc: int | None, compiler_version: str | None, compiler: str | None,
            store_url: str | None, layout: str, local_root: str | None, shell: str, as_json: bool) -> None:
    """Print the exports a training or serving job needs to use the shared cache.

    The cache directories are versioned by toolchain (compiler version, target, LNC), so
    trn1 and trn2 jobs, or two compiler versions, never share NEFFs by accident. vLLM-Neuron
    gets the store as its shared tier (NEURON_LIBTORCH_REMOTE_CACHE) and a directory on local
    disk as its local tier (VLLM_CACHE_ROOT).

    \b
    Example:
      eval "$(neffcache env --instance trn2.48xlarge --store /mnt/fsx/neuron-cache)"
      eval "$(neffcache env --instance trn2.48xlarge --store /mnt/fsx/neuron-cache --layout vllm --local /nvme/vllm)"
    """
    settings = load_settings(instance=instance, compiler=compiler, compiler_version=compiler_version,
                             stores=(store_url,) if store_url else (), local_root=local_root)
    toolchain = job_toolchain(settings, lnc)
    env, notes = job_env(settings.local_store, toolchain, chosen_layouts(layout), local_root=settings.local_root)
    if shell == "json" or as_json:
        render(True, {"toolchain": toolchain.to_json(), "env": env, "notes": notes}, str)
        return
    click.echo(f"# neffcache: {toolchain.label} ({settings.instance})")
    for note in notes:
        click.echo(f"# note: {note}")
    click.echo(render_env(env, shell))


@click.command("config")
@json_option
def config_cmd(as_json: bool) -> None:
    """Show the settings in effect, as neffcache.toml takes them, and where they came from.

    Precedence: flags > NEFFCACHE_* variables > $NEFFCACHE_CONFIG or ./neffcache.toml >
    ~/.config/neffcache/neffcache.toml > defaults. Unset settings and the token are comments.

    \b
    Example:
      NEFFCACHE_STORES=/nvme/cache,s3://bucket/cache neffcache config --json
    """
    settings = load_settings()
    data = dataclasses.asdict(settings)
    data["token"] = "***" if settings.token else None
    shown = {k: v for k, v in dataclasses.asdict(settings).items() if k != "sources"}
    came_from = ", ".join(settings.sources) or "no file or variable"
    render(as_json, data, lambda: "\n".join([f"# in effect: defaults, then {came_from}; as neffcache.toml takes it",
                                             *toml_lines(shown, hidden=frozenset({"token"}))]))


COMMANDS: list[click.Command] = [verify_cmd, env_cmd, config_cmd]
