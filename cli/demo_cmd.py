"""``neffcache demo``: the main job on the embedded default, end to end, in about a minute."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import click

from neffcache.jobenv import job_env
from neffcache.scan import scan
from neffcache.stores import open_store
from neffcache.toolchain import find_compiler, resolve_toolchain

from .cache_cmds import _scan_text

INSTANCE = "trn2.48xlarge"
HIT = re.compile(r"Using a cached neff at |\[NEFF_CACHE\] Cache HIT")
MISS = re.compile(r"Call compiler with cmd: |\[NEFF_CACHE\] Cache MISS")


def _toolchain_bin(workdir: Path) -> tuple[dict[str, str], bool]:
    env = dict(os.environ)
    try:
        find_compiler()
        return env, False
    except FileNotFoundError:
        from neffcache.testing.shim import install_compiler_shim, simulated_env

        bin_dir = workdir / "bin"
        install_compiler_shim(bin_dir, compile_seconds=0.3)
        return simulated_env(bin_dir, base=env), True


def _run_workload(env: dict[str, str], label: str) -> tuple[int, int]:
    cmd = [sys.executable, "-m", "neffcache.testing.workload", "--model", "llama-tiny",
           "--bucket", "128,256,512", "--graphs", "4"]
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    hits = sum(1 for line in proc.stderr.splitlines() if HIT.search(line))
    misses = sum(1 for line in proc.stderr.splitlines() if MISS.search(line))
    click.echo(f"  {label}: {hits} hits, {misses} compiles in {time.monotonic() - started:.1f}s "
               f"(exit {proc.returncode})")
    if proc.returncode != 0:
        click.echo(proc.stderr[-2000:], err=True)
        raise click.ClickException(f"the workload failed ({label})")
    return hits, misses


@click.command("demo")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path(".demo"),
              show_default=True, help="Where the demo keeps its cache (wiped at the start).")
def demo_cmd(workdir: Path) -> None:
    """Run the main job on the embedded default and show the result.

    Uses a local store and the simulated Neuron toolchain (neffcache.testing) when no real
    neuronx-cc is on PATH: a compile-only workload runs twice over three shape buckets; the
    second run is served entirely from the cache.

    \b
    Example:
      neffcache demo --workdir /tmp/neffcache-demo
    """
    workdir = workdir.absolute()
    shutil.rmtree(workdir / "cache", ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    env, simulated = _toolchain_bin(workdir)
    if simulated:
        click.echo("neffcache demo: no neuronx-cc on PATH, so this uses the SIMULATED Neuron toolchain "
                   "(neffcache.testing): fake NEFFs, real processes, real cache layout.")
    old_path = os.environ.get("PATH", "")
    os.environ["PATH"] = env["PATH"]
    try:
        toolchain = resolve_toolchain(INSTANCE)
    finally:
        os.environ["PATH"] = old_path
    store_url = str(workdir / "cache")
    store = open_store(store_url)
    variables, _ = job_env(store_url, toolchain, ("neuronxcc",))
    env.update(variables)
    env.update({"TORCH_NEURONX_COMPILE_ONLY": "1", "NEURON_RT_FAKE_INSTANCE_TYPE": INSTANCE,
                "TMPDIR": str(workdir)})
    click.echo(f"toolchain: {toolchain.label}; store: {store_url}")
    for key, value in variables.items():
        click.echo(f"  {key}={value}")
    click.echo("compile-only workload (llama-tiny, buckets 128/256/512, 4 graphs each):")
    _run_workload(env, "first run ")
    hits, misses = _run_workload(env, "second run")
    click.echo("")
    click.echo(_scan_text(scan(store), show_entries=False))
    verdict = "all hits" if misses == 0 and hits else "NOT all hits"
    click.echo(f"\nsecond run: {verdict} ({hits} hits, {misses} compiles)")
    if misses:
        sys.exit(1)


COMMANDS: list[click.Command] = [demo_cmd]
