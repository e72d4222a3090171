"""The simulated TorchNeuron native workload against layout B (sharded NEFF dir + HLO dir)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from neffcache.keys import cache_key
from neffcache.testing.hlo import make_hlo
from neffcache.toolchain import Toolchain
from tests.simulation import Sim

TOOLCHAIN = Toolchain("2.27.5334.0+f702b353", "trn2", 2)


def _native(sim: Sim, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    dirs = {
        "TORCH_NEURONX_NEFF_CACHE_DIR": str(sim.root / "neff"),
        "TORCH_NEURONX_HLO_CACHE_DIR": str(sim.root / "hlo"),
        "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR": str(sim.root / "local"),
    }
    return sim.run_workload("--backend", "native", *args, **{**dirs, **env})


def _keys(graphs: int, flags: list[str]) -> list[str]:
    return [cache_key(make_hlo("llama-tiny", 128, i, 20_000), flags, TOOLCHAIN) for i in range(graphs)]


def test_second_run_hits_and_files_are_sharded(sim: Sim) -> None:
    flags = ["--model-type=transformer"]
    first = _native(sim, "--graphs", "2", NEURON_CC_FLAGS=" ".join(flags))
    assert first.returncode == 0, first.stderr
    keys = _keys(2, flags)
    assert re.findall(r"\[NEFF_CACHE\] Cache MISS for key: (\w+)", first.stderr) == keys
    assert re.findall(r"\[NEFF_CACHE\] Storing NEFF for key: (\w+)", first.stderr) == keys
    second = _native(sim, "--graphs", "2", NEURON_CC_FLAGS=" ".join(flags))
    assert re.findall(r"\[NEFF_CACHE\] Cache HIT for key: (\w+)", second.stderr) == keys
    assert "MISS" not in second.stderr and "compiled=0" in second.stderr
    assert len(sim.compiles()) == 2
    for i, key in enumerate(keys):
        shard = Path(key[:2]) / key[2:4]
        hlo_dir = sim.root / "hlo" / shard
        assert (sim.root / "neff" / shard / f"{key}.neff").is_file()
        assert (hlo_dir / f"{key}.hlo").read_bytes() == make_hlo("llama-tiny", 128, i, 20_000)
        assert json.loads((hlo_dir / f"{key}.flags.json").read_text()) == flags
    assert sorted((sim.root / "local" / "locks").iterdir()) == []  # locks live on local disk only
    assert not any(p.name.endswith((".lock", ".tmp")) for p in (sim.root / "neff").rglob("*"))


def test_native_needs_its_cache_dir(sim: Sim) -> None:
    proc = sim.run_workload("--backend", "native")
    assert proc.returncode == 2 and "TORCH_NEURONX_NEFF_CACHE_DIR" in proc.stderr
    via_env = sim.run_workload(NEFFSIM_BACKEND="native")
    assert via_env.returncode == 2 and "TORCH_NEURONX_NEFF_CACHE_DIR" in via_env.stderr


def test_failures_are_not_cached(sim: Sim) -> None:
    failed = _native(sim, "--graphs", "1", NEFFSIM_FAIL_MATCH=".")
    assert failed.returncode == 1
    [key] = _keys(1, [])
    assert f"[NEFF_CACHE] Compilation FAILED for key: {key}: " in failed.stderr
    assert not list((sim.root / "neff").rglob("*.neff"))
    again = _native(sim, "--graphs", "1")
    assert again.returncode == 0 and f"Storing NEFF for key: {key}" in again.stderr
    assert len(sim.compiles()) == 2


def test_lock_of_a_dead_owner_is_broken_and_a_live_one_waited_on(sim: Sim) -> None:
    [key] = _keys(1, [])
    locks = sim.root / "local" / "locks"
    locks.mkdir(parents=True)
    (locks / f"{key}.lock").write_text("999999999\n")  # no such pid: its owner died
    proc = _native(sim, "--graphs", "1")
    assert proc.returncode == 0, proc.stderr
    assert "compiled=1" in proc.stderr

    other = make_hlo("llama-tiny", 128, 1, 20_000)
    key1 = cache_key(other, [], TOOLCHAIN)
    (locks / f"{key1}.lock").write_text("1\n")  # pid 1 is alive: someone is compiling
    waited = _native(sim, "--graphs", "2", NEFFSIM_LOCK_TIMEOUT="0.5", NEFFSIM_LOCK_LOG_SECONDS="0.2")
    assert waited.returncode == 1
    assert f"[NEFF_CACHE] Waiting for lock on key: {key1}" in waited.stderr
    assert f"[NEFF_CACHE] Compilation FAILED for key: {key1}: timed out" in waited.stderr
