"""The simulated TorchNeuron native workload against layout B (sharded NEFF dir + HLO dir)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

from neffcache.testing.hlo import make_hlo
from neffcache.testing.native_cache import native_key, op_key
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


def _hlo(i: int) -> bytes:
    return make_hlo("llama-tiny", 128, i, 20_000)


def _keys(graphs: int, flags: list[str]) -> list[str]:
    return [native_key(op_key(_hlo(i)), TOOLCHAIN, flags, _hlo(i)) for i in range(graphs)]


def _ops(graphs: int) -> list[str]:
    return [op_key(_hlo(i)) for i in range(graphs)]


def test_keys_are_32_hex_and_lines_carry_readable_op_keys() -> None:
    keys = _keys(3, [])
    assert all(re.fullmatch(r"[0-9a-f]{32}", k) for k in keys) and len(set(keys)) == 3
    assert _ops(2) == ["aten::mm_t0_(128, 64)_llama-tiny_g0", "aten::add_t0_(128, 64)_llama-tiny_g1"]
    assert _keys(1, ["-O1"]) != _keys(1, []) and native_key("x", Toolchain("2.21.1.0+a", "trn1", 1), [], b"")\
        != native_key("x", TOOLCHAIN, [], b"")


def test_second_run_hits_and_files_are_sharded(sim: Sim) -> None:
    flags = ["--model-type=transformer"]
    first = _native(sim, "--graphs", "2", NEURON_CC_FLAGS=" ".join(flags))
    assert first.returncode == 0, first.stderr
    keys, ops = _keys(2, flags), _ops(2)
    assert re.findall(r"\[NEFF_CACHE\] Cache MISS for key: (.+)", first.stderr) == ops
    assert re.findall(r"\[NEFF_CACHE\] Storing NEFF for key: (.+)", first.stderr) == ops
    second = _native(sim, "--graphs", "2", NEURON_CC_FLAGS=" ".join(flags))
    assert re.findall(r"\[NEFF_CACHE\] Cache HIT for key: (.+)", second.stderr) == ops
    assert "MISS" not in second.stderr and "compiled=0" in second.stderr
    assert len(sim.compiles()) == 2
    for i, key in enumerate(keys):
        shard = Path(key[:2]) / key[2:4]
        hlo_dir = sim.root / "hlo" / shard
        assert (sim.root / "neff" / shard / f"{key}.neff").is_file()
        assert (hlo_dir / f"{key}.hlo").read_bytes() == make_hlo("llama-tiny", 128, i, 20_000)
        assert json.loads((hlo_dir / f"{key}.flags.json").read_text()) == flags
    assert sorted((sim.root / "local" / "locks").iterdir()) == []  # locks live on local disk only
    assert not any(".lock" in p.name or ".tmp" in p.name for p in (sim.root / "neff").rglob("*"))


def test_native_needs_its_cache_dir(sim: Sim) -> None:
    proc = sim.run_workload("--backend", "native")
    assert proc.returncode == 2 and "TORCH_NEURONX_NEFF_CACHE_DIR" in proc.stderr
    via_env = sim.run_workload(NEFFSIM_BACKEND="native")
    assert via_env.returncode == 2 and "TORCH_NEURONX_NEFF_CACHE_DIR" in via_env.stderr


def test_failures_are_not_cached(sim: Sim) -> None:
    failed = _native(sim, "--graphs", "1", NEFFSIM_FAIL_MATCH=".")
    assert failed.returncode == 1
    [op] = _ops(1)
    assert f"RuntimeError: neuronx-cc failed to compile {op}: " in failed.stderr
    assert "FAILED" not in failed.stderr  # no [NEFF_CACHE] failure line exists
    assert not list((sim.root / "neff").rglob("*.neff*"))
    again = _native(sim, "--graphs", "1")
    assert again.returncode == 0 and f"Storing NEFF for key: {op}" in again.stderr
    assert len(sim.compiles()) == 2


def test_lock_of_a_dead_owner_is_broken_and_a_live_one_waited_on(sim: Sim) -> None:
    [key] = _keys(1, [])
    locks = sim.root / "local" / "locks"
    locks.mkdir(parents=True)
    (locks / f"{key}.lock").write_text("999999999\n")  # no such pid: its owner died
    proc = _native(sim, "--graphs", "1")
    assert proc.returncode == 0, proc.stderr
    assert "compiled=1" in proc.stderr

    key1 = _keys(2, [])[1]
    (locks / f"{key1}.lock").write_text("1\n")  # pid 1 is alive: someone is compiling
    waited = _native(sim, "--graphs", "2", NEFFSIM_LOCK_TIMEOUT="0.5", NEFFSIM_LOCK_LOG_SECONDS="0.2")
    assert waited.returncode == 1
    assert f"waiting for lock {locks / key1}.lock" in waited.stderr
    assert f"RuntimeError: {_ops(2)[1]}: timed out waiting for lock" in waited.stderr

    # The runtime breaks a lock older than 1200 s, whoever holds it.
    old = time.time() - 1300
    os.utime(locks / f"{key1}.lock", (old, old))
    broken = _native(sim, "--graphs", "2")
    assert broken.returncode == 0 and "compiled=1" in broken.stderr, broken.stderr


def test_the_store_is_written_through_the_runtimes_temp_name(sim: Sim) -> None:
    from neffcache.testing import native_cache

    target = sim.root / "neff" / "ab" / "cd" / ("abcd" + "0" * 28 + ".neff")
    target.parent.mkdir(parents=True)
    tmp = native_cache._temp_beside(target)
    assert re.fullmatch(r"abcd0{28}\.neff\.tmp\.[A-Za-z0-9]{6}", tmp.name) and tmp.exists()
