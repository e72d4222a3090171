"""The simulated TorchNeuron native workload against the torchneuron layout: both writers (the C++
one's sharded NEFFs, the kernel path's ``<K>/<K>.neff``), the HLO dir, the in-process dictionary."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from neffcache.testing.hlo import make_hlo
from neffcache.testing.native_cache import kernel_key, native_key, op_key
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
    # NEURON_COMPILER_OPT_LEVEL is part of the C++ key too; the kernel key carries the compiler version.
    assert native_key("x", TOOLCHAIN, [], b"", "-O2") != native_key("x", TOOLCHAIN, [], b"", "-O1")
    assert kernel_key(b"k", TOOLCHAIN, []) != kernel_key(b"k", Toolchain("2.28.1.0+b", "trn2", 2), [])
    assert re.fullmatch(r"[0-9a-f]{64}", kernel_key(b"k", TOOLCHAIN, []))


def test_second_run_hits_the_disk_behind_in_process_miss_lines(sim: Sim) -> None:
    """The lines come from an in-process dictionary consulted before the disk: a fresh process
    prints MISS for every op whether or not the disk holds its NEFF, so a disk hit is a MISS
    line and nothing more; HIT is a graph the process already had (a later step)."""
    flags = ["--model-type=transformer"]
    first = _native(sim, "--graphs", "2", NEURON_CC_FLAGS=" ".join(flags))
    assert first.returncode == 0, first.stderr
    keys, ops = _keys(2, flags), _ops(2)
    assert re.findall(r"\[NEFF_CACHE\] Cache MISS for key: (.+)", first.stderr) == ops
    assert re.findall(r"\[NEFF_CACHE\] Storing NEFF for key: (.+)", first.stderr) == ops
    second = _native(sim, "--graphs", "2", NEURON_CC_FLAGS=" ".join(flags))
    assert re.findall(r"\[NEFF_CACHE\] Cache MISS for key: (.+)", second.stderr) == ops
    assert "Cache HIT" not in second.stderr and "Storing" not in second.stderr
    assert "hits=2 compiled=0" in second.stderr
    assert len(sim.compiles()) == 2
    for i, key in enumerate(keys):
        shard = Path(key[:2]) / key[2:4]
        hlo_dir = sim.root / "hlo" / shard
        assert (sim.root / "neff" / shard / f"{key}.neff").is_file()
        assert (hlo_dir / f"{key}.hlo").read_bytes() == make_hlo("llama-tiny", 128, i, 20_000)
        assert json.loads((hlo_dir / f"{key}.flags.json").read_text()) == ["-O1", *flags]
    assert sorted((sim.root / "local" / "locks").iterdir()) == []  # locks live on local disk only
    assert not any(".lock" in p.name or ".tmp" in p.name for p in (sim.root / "neff").rglob("*"))
    # A training run (not compile-only) looks its graphs up again every step: HIT lines, no compile.
    steps = _native(sim, "--graphs", "2", "--steps", "3", NEURON_CC_FLAGS=" ".join(flags),
                    TORCH_NEURONX_COMPILE_ONLY="0")
    assert steps.returncode == 0, steps.stderr
    assert len(re.findall(r"Cache MISS", steps.stderr)) == 2 and len(re.findall(r"Cache HIT", steps.stderr)) == 6
    assert len(sim.compiles()) == 2


def test_kernels_go_through_the_python_path(sim: Sim) -> None:
    """``<K>/<K>.neff`` (64 hex, the compiler version in K), written as ``<K>/tmpXXXXXXXX.tmp`` and
    renamed, its lock under ``<local>/<K>/locks/compile.lock``, no [NEFF_CACHE] line of its own."""
    first = _native(sim, "--graphs", "1", "--kernels", "2")
    assert first.returncode == 0, first.stderr
    assert "graphs=3 hits=0 compiled=3" in first.stderr
    assert len(re.findall(r"\[NEFF_CACHE\]", first.stderr)) == 2  # the graph's MISS and Storing only
    kernels = [p for p in (sim.root / "neff").iterdir() if len(p.name) == 64]
    assert len(kernels) == 2
    for directory in kernels:
        assert [p.name for p in directory.iterdir()] == [f"{directory.name}.neff"]
        assert (sim.root / "local" / directory.name / "locks").is_dir()
        assert not (sim.root / "local" / directory.name / "locks" / "compile.lock").exists()
    again = _native(sim, "--graphs", "1", "--kernels", "2")
    assert "graphs=3 hits=3 compiled=0" in again.stderr
    assert _native(sim, "--kernels", "1").returncode == 0
    assert sim.run_workload("--kernels", "1").returncode == 2  # the xla backend has no kernel path


def test_a_disabled_disk_cache_compiles_every_graph_and_keeps_none(sim: Sim) -> None:
    for _ in range(2):
        proc = _native(sim, "--graphs", "2", "--kernels", "1", TORCH_NEURONX_NEFF_DISABLE_CACHE="1")
        assert proc.returncode == 0 and "compiled=3" in proc.stderr, proc.stderr
    assert len(sim.compiles()) == 6 and not list((sim.root / "neff").rglob("*.neff"))


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

    # A waiter breaks the lock after TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT seconds of waiting (not
    # an age of the file: a fresh lock is broken too, an old one is waited on like any other).
    broken = _native(sim, "--graphs", "2", TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT="0.3")
    assert broken.returncode == 0 and "compiled=1" in broken.stderr, broken.stderr


def test_the_store_is_written_through_each_writers_temp_name(sim: Sim) -> None:
    from neffcache.testing import native_cache

    shard = sim.root / "neff" / "ab" / "cd"
    shard.mkdir(parents=True)
    tmp = native_cache._mkstemp(shard)
    assert re.fullmatch(r"\.tmp\.[A-Za-z0-9]{6}", tmp.name) and tmp.exists()
    kernel = native_cache._kernel_temp(shard)
    assert re.fullmatch(r"tmp[a-z0-9_]{8}\.tmp", kernel.name) and kernel.exists()
