"""The simulated vLLM-Neuron server: the documented variables, both tiers, the ready lines."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from neffcache.testing.hlo import make_hlo
from neffcache.testing.vllm_cache import MARKER, cache_key
from neffcache.testing.vllm_server import _ARGS
from tests.simulation import Sim

VERSION = "2.27.5334.0+f702b353"
ARGS = ("--model", "llama-tiny", "--graphs", "3", "--exit-when-ready")


def _counts(stderr: str) -> dict[str, int]:
    line = [ln for ln in stderr.splitlines() if "graphs=" in ln][-1]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def _compile_env(sim: Sim, **extra: str) -> dict[str, str]:
    return {"VLLM_CACHE_ROOT": str(sim.root / "local"), "NEURON_LIBTORCH_REMOTE_CACHE": str(sim.root / "remote"),
            "VLLM_NEURON_CPU_COMPILE": "1", "NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", **extra}


def _entries(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []


def test_cpu_compile_fills_the_local_tier_and_prints_the_ready_lines(sim: Sim) -> None:
    proc = sim.run_vllm_server(*ARGS, **_compile_env(sim))
    assert proc.returncode == 0, proc.stderr
    assert "SIMULATED vLLM-Neuron server" in proc.stderr and "workers=8" in proc.stderr
    assert _counts(proc.stderr) == {"graphs": 3, "hits": 0, "fetched": 0, "compiled": 3, "failed": 0}
    assert "INFO:     Application startup complete." in proc.stderr
    assert "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)" in proc.stderr
    local = _entries(sim.root / "local" / "neuron" / "compile_cache")
    assert len(local) == 3 and len(sim.compiles()) == 3
    for entry in local:
        assert re.fullmatch(r"[0-9a-f]{32}", entry.name)
        names = {str(p.relative_to(entry)) for p in entry.rglob("*") if p.is_file()}
        assert {MARKER, "graph.hlo", "metadata.json", f"graph_{entry.name}.neff"} <= names
        assert any(n.startswith("nki/") and n.count("/") == 2 for n in names)
    keys = {cache_key(make_hlo("llama-tiny", 128, i), neuronxcc=VERSION, target="trn2", args=_ARGS) for i in range(3)}
    assert {p.name for p in local} == keys
    assert not (sim.root / "remote").exists()  # vLLM promotes only through save_cache()
    again = sim.run_vllm_server(*ARGS, **_compile_env(sim))
    assert _counts(again.stderr)["hits"] == 3 and len(sim.compiles()) == 3


def test_save_remote_and_a_fresh_node_fetches(sim: Sim) -> None:
    first = sim.run_vllm_server(*ARGS, **_compile_env(sim, NEFFSIM_VLLM_SAVE_REMOTE="1"))
    assert first.returncode == 0, first.stderr
    remote = _entries(sim.root / "remote")
    assert len(remote) == 3 and all((p / MARKER).is_file() for p in remote)
    assert not [p for p in (sim.root / "remote").iterdir() if p.name.startswith(".")]  # no staging left
    node = sim.run_vllm_server(*ARGS, **_compile_env(sim, VLLM_CACHE_ROOT=str(sim.root / "node2"),
                                                     VLLM_NEURON_DISABLE_WARMUP_COMPILE="1"))
    assert node.returncode == 0, node.stderr
    assert _counts(node.stderr)["fetched"] == 3 and len(sim.compiles()) == 3
    assert len(_entries(sim.root / "node2" / "neuron" / "compile_cache")) == 3


@pytest.mark.parametrize(("env", "message"), [
    ({"VLLM_NEURON_CPU_COMPILE": "1"}, "NEURON_PLATFORM_TARGET_OVERRIDE is required"),
    ({"VLLM_NEURON_CPU_COMPILE": "1", "NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", "VLLM_NEURON_CPU_MODE": "1"},
     "cannot be enabled together"),
    ({}, "no Neuron device found"),
])
def test_it_refuses_to_start_like_the_real_server(sim: Sim, env: dict[str, str], message: str) -> None:
    proc = sim.run_vllm_server(*ARGS, VLLM_CACHE_ROOT=str(sim.root / "local"), **env)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    assert "Application startup complete." not in proc.stderr and not sim.compiles()


def test_a_miss_is_fatal_when_the_fleet_must_start_warm(sim: Sim) -> None:
    proc = sim.run_vllm_server(*ARGS, VLLM_CACHE_ROOT=str(sim.root / "local"), NEFFSIM_VLLM_DEVICE="trn2.48xlarge",
                               VLLM_NEURON_DISABLE_WARMUP_COMPILE="1")
    assert proc.returncode == 1 and "RuntimeError: compile cache miss" in proc.stderr
    assert not sim.compiles() and "Uvicorn running" not in proc.stderr


def test_cache_off_and_cpu_mode(sim: Sim) -> None:
    off = _compile_env(sim, NEURON_LIBTORCH_DISABLE_COMPILE_CACHE="1", NEFFSIM_VLLM_SAVE_REMOTE="1")
    for _ in range(2):
        assert sim.run_vllm_server(*ARGS, **off).returncode == 0
    assert len(sim.compiles()) == 6 and not (sim.root / "local").exists() and not (sim.root / "remote").exists()
    cpu = sim.run_vllm_server(*ARGS, VLLM_NEURON_CPU_MODE="1")
    assert cpu.returncode == 0 and "Uvicorn running" in cpu.stderr and len(sim.compiles()) == 6


def test_it_waits_on_another_process_lock_until_the_timeout(sim: Sim) -> None:
    env = _compile_env(sim, NEURON_LIBTORCH_COMPILATION_TIMEOUT="0.3", NEURON_LIBTORCH_PARALLEL_COMPILE_WORKERS="2")
    cache = sim.root / "local" / "neuron" / "compile_cache"
    cache.mkdir(parents=True)
    key = cache_key(make_hlo("llama-tiny", 128, 1), neuronxcc=VERSION, target="trn2", args=_ARGS)
    (cache / f"{key}.lock").write_text(f"{os.getpid()}\n")  # a live owner
    proc = sim.run_vllm_server(*ARGS, **env)
    assert proc.returncode == 1 and "timed out after 0.3 s" in proc.stderr and "workers=2" in proc.stderr
    assert _counts(proc.stderr) == {"graphs": 3, "hits": 0, "fetched": 0, "compiled": 2, "failed": 1}
    # A dead owner's lock is broken.
    (cache / f"{key}.lock").write_text("999999999\n")
    again = sim.run_vllm_server(*ARGS, **env)
    assert again.returncode == 0 and _counts(again.stderr)["compiled"] == 1


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_it_serves_until_stopped_then_exits_0(sim: Sim, sig: int) -> None:
    with subprocess.Popen([sys.executable, "-m", "neffcache.testing.vllm_server", "--model", "m", "--graphs", "1"],
                          env={**sim.env, **_compile_env(sim)}, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "Uvicorn running on" in line:
                break
        proc.send_signal(sig)
        rest = proc.stderr.read()
        assert proc.wait(timeout=30) == 0
    assert "Application shutdown complete." in rest
