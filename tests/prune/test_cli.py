"""``neffcache prune``: a compiler bump on a cache the simulated runtime wrote, flags, output, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from neffcache.cli.main import cli
from neffcache.cli.prune import budgets
from neffcache.scan.report import scan
from neffcache.stores import open_store
from neffcache.testing.shim import install_compiler_shim
from neffcache.units import parse_duration, parse_size
from tests.prune.helpers import NEW, OLD, listing
from tests.simulation import Sim

SUMMARY = "neffcache.testing.workload: graphs="


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "neffcache.cli.main", *args], capture_output=True, text=True,
                          env=env, check=False, timeout=60)


@pytest.mark.slow
def test_compiler_bump_on_a_runtime_written_cache(sim: Sim) -> None:
    """The runtime (simulated libneuronxla) fills a cache with one compiler; after the bump the old
    toolchain shows up as reclaimable for `--keep-compiler current`, and is pruned with --yes."""
    cache = sim.root / "xla-cache"
    install_compiler_shim(sim.bin_dir, version=OLD)
    first = sim.run_workload("--graphs", "2", "--bucket", "128,256", NEURON_COMPILE_CACHE_URL=str(cache))
    assert first.returncode == 0, first.stderr
    install_compiler_shim(sim.bin_dir, version=NEW)  # the image rebuild: a new neuronx-cc on PATH
    second = sim.run_workload("--graphs", "1", "--bucket", "128", NEURON_COMPILE_CACHE_URL=str(cache))
    assert second.returncode == 0, second.stderr
    store = open_store(str(cache))
    assert {e.namespace.compiler_version for e in scan(store).entries} == {OLD, NEW}
    old_version = OLD

    plan = run_cli("prune", "--store", str(cache), "--keep-compiler", "current", "--json", env=sim.env)
    assert plan.returncode == 0, plan.stderr
    data = json.loads(plan.stdout)
    assert data["executed"] is False and data["plan"]["entries"] == 4
    assert list(data["plan"]["by_toolchain"]) == [f"neuronxcc-{old_version} (target not recorded)"]
    text = run_cli("prune", "--store", str(cache), "--keep-compiler", "current", env=sim.env)
    assert "dry run: nothing was changed" in text.stdout and f"neuronxcc-{old_version}" in text.stdout

    # 4 of the 5 entries and most of the bytes: the guard rails want --force as well.
    before = listing(store)
    refused = run_cli("prune", "--store", str(cache), "--keep-compiler", "current", "--yes", env=sim.env)
    assert refused.returncode == 9 and "refused: the plan removes" in refused.stderr, refused.stderr
    assert listing(store) == before
    done = run_cli("prune", "--store", str(cache), "--keep-compiler", "current", "--yes", "--force", env=sim.env)
    assert done.returncode == 0, done.stderr
    assert "removed 4 items (4 entries)" in done.stdout
    assert {e.namespace.compiler_version for e in scan(store).entries} == {NEW}
    again = sim.run_workload("--graphs", "1", "--bucket", "128", NEURON_COMPILE_CACHE_URL=str(cache))
    assert "hits=1 compiled=0" in again.stderr  # the current toolchain's entry was never touched


def test_sizes_and_durations() -> None:
    assert parse_size("500G") == 500 * 10**9 and parse_size("1.5T") == 1_500_000_000_000
    assert parse_size("64GiB") == 64 * 2**30 and parse_size("1000") == 1000 and parse_size("2 mb") == 2_000_000
    assert parse_duration("30d") == 30 * 86400 and parse_duration("12h") == 43200 and parse_duration("90") == 90
    assert parse_duration("1.5w") == 1.5 * 7 * 86400
    for bad in ("lots", "5X", "", "-1G"):
        with pytest.raises(ValueError):
            parse_size(bad)
    with pytest.raises(ValueError):
        parse_duration("3 fortnights")


def test_budget_per_store(tmp_path: Path) -> None:
    stores = [open_store(str(tmp_path / "a")), open_store(f"fsx://{tmp_path / 'b'}")]
    given = [str(tmp_path / "a"), f"fsx://{tmp_path / 'b'}"]
    assert budgets(("500G", f"fsx://{tmp_path / 'b'}=2T"), given, stores) == {"*": 500 * 10**9,
                                                                              stores[1].url: 2 * 10**12}
    assert budgets((f"{stores[0].url}=1G",), given, stores) == {stores[0].url: 10**9}
    with pytest.raises(click.BadParameter, match="not one of the --store"):
        budgets(("/elsewhere=1G",), given, stores)


def test_flags_output_and_errors(tmp_path: Path) -> None:
    from tests.prune.helpers import runtime_a

    store = open_store(str(tmp_path / "c"))
    for i in range(3):
        runtime_a(store, f"g{i}".encode())
    runtime_a(store, b"new", version=NEW)
    runtime_a(store, b"bad", version=NEW, state="FAILED")
    before = listing(store)
    runner = CliRunner()
    base = ["prune", "--store", str(tmp_path / "c")]
    shown = runner.invoke(cli, [*base, "--keep-last", "1", "--failed", "--entries"], catch_exceptions=False)
    assert shown.exit_code == 0
    assert "compiler" in shown.output and "failed" in shown.output and f"compiler {OLD} not kept" in shown.output
    assert listing(store) == before
    done = runner.invoke(cli, [*base, "--keep-last", "1", "--failed", "--yes", "--force", "--json"],
                         catch_exceptions=False)
    data = json.loads(done.output)
    assert data["executed"] and data["result"]["removed_entries"] == 4
    assert data["result"]["freed_bytes"] == data["plan"]["expected_freed_bytes"]
    assert len(scan(store).entries) == 1

    nothing = run_cli(*base)
    assert nothing.returncode == 2 and nothing.stderr.startswith("neffcache: configuration error: nothing to prune")
    bad = run_cli(*base, "--older-than", "soon")
    assert bad.returncode == 2 and "not a duration" in bad.stderr
    no_store = run_cli("prune", "--failed")
    assert no_store.returncode == 2 and "--store" in no_store.stderr
    missing = run_cli("prune", "--store", str(tmp_path / "nope"), "--failed")
    assert missing.returncode == 4 and "does not exist" in missing.stderr
