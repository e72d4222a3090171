"""`neffcache warm` of a vLLM-Neuron server (the simulated one): real `neffcache`, server and
`neuronx-cc` processes. The server compiles on this CPU host, is stopped once it says it is up,
and what it compiled reaches the store's flat shared tier, where a production start finds it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from neffcache.entry import EntryState
from neffcache.warmers.children import stop_ready_server
from tests.warmers.conftest import INSTANCE, V1, Cli, Index, healthy
from tests.warmers.test_failures import _alive, _no_compiler_left

SERVER = (sys.executable, "-m", "neffcache.testing.vllm_server")
NS = f"trn2-lnc2/vllm-{V1}"
HEX32 = re.compile(r"[0-9a-f]{32}\Z")


def vllm_warm_args(store: Path | str, *extra: str, buckets: str = "128,256", graphs: int = 2,
                   server: tuple[str, ...] = ()) -> list[str]:
    return ["warm", "--instance", INSTANCE, "--store", str(store), "--bucket", f"SEQ={buckets}", "--quiet", *extra,
            "--", *SERVER, "--model", "llama-tiny", "--bucket", "{SEQ}", "--graphs", str(graphs), *server]


def _server_pids(report: dict[str, Any]) -> list[int]:
    pids = []
    for group in report["groups"]:
        found = re.search(r"SIMULATED vLLM-Neuron server .* pid=(\d+)", Path(group["log"]).read_text())
        assert found is not None, group["log"]
        pids.append(int(found.group(1)))
    return pids


def _serving_env(cli: Cli, store: Path) -> dict[str, str]:
    """What a serving pod gets: `neffcache env --layout vllm`."""
    proc = cli.run("env", "--instance", INSTANCE, "--store", str(store), "--layout", "vllm", "--shell", "json",
                   "--local", str(cli.sim.root / "pod-local"))
    assert proc.returncode == 0, proc.stderr
    env: dict[str, str] = json.loads(proc.stdout)["env"]
    return env


@pytest.mark.parametrize("save_remote", ["0", "1"], ids=["vllm-saves-nothing", "vllm-saves-remote"])
def test_warm_fills_the_flat_shared_tier_then_production_starts_warm(cli: Cli, tmp_path: Path,
                                                                      save_remote: str) -> None:
    store = tmp_path / "store"
    args = vllm_warm_args(store, "--tag", "model=llama-tiny")
    first = cli.json(*args, NEFFSIM_VLLM_SAVE_REMOTE=save_remote)
    assert first["ok"], first
    assert {k: first["totals"][k] for k in ("graphs", "hits", "compiled", "failed")} == \
        {"graphs": 4, "hits": 0, "compiled": 4, "failed": 0}
    assert [(g["name"], g["compiled"], g["status"]) for g in first["groups"]] == \
        [("SEQ=128", 2, "ok"), ("SEQ=256", 2, "ok")]
    assert first["totals"]["bytes"] > 0
    assert len(cli.sim.compiles()) == 4
    # Stopped once up: no server, no compiler left; its private local tiers are gone.
    assert not [pid for pid in _server_pids(first) if _alive(pid)]
    _no_compiler_left(cli)
    assert not list(Path(os.environ["NEFFCACHE_LOCAL_ROOT"]).glob("warm-*"))

    report = healthy(store)
    assert len(report.entries) == 4
    for entry in report.entries:
        assert entry.layout == "vllm" and entry.state is EntryState.SUCCESS
        assert entry.namespace.path == NS and entry.path == f"{NS}/{entry.key}" and HEX32.match(entry.key)
        assert entry.manifest is not None and entry.manifest.tags["model"] == "llama-tiny"
        assert entry.manifest.tags["bucket"] in ("SEQ=128", "SEQ=256")
        assert entry.manifest.toolchain is not None and entry.manifest.toolchain.target == "trn2"
        assert f"graph_{entry.key}.neff" in entry.files and any(n.startswith("nki/") for n in entry.files)

    second = cli.json(*args, NEFFSIM_VLLM_SAVE_REMOTE=save_remote)
    assert {k: second["totals"][k] for k in ("graphs", "hits", "compiled")} == {"graphs": 4, "hits": 4, "compiled": 0}
    assert len(cli.sim.compiles()) == 4

    # Production: the pod's env from `neffcache env`, a device, and a miss is fatal.
    pod = {**_serving_env(cli, store), "NEFFSIM_VLLM_DEVICE": INSTANCE, "VLLM_NEURON_DISABLE_WARMUP_COMPILE": "1"}
    assert pod["NEURON_LIBTORCH_REMOTE_CACHE"] == str(store / NS)
    assert not pod["VLLM_CACHE_ROOT"].startswith(str(store))
    served = cli.sim.run_vllm_server("--model", "llama-tiny", "--bucket", "128,256", "--graphs", "2",
                                     "--exit-when-ready", **pod)
    assert served.returncode == 0, served.stderr
    assert "graphs=4 hits=0 fetched=4 compiled=0 failed=0" in served.stderr
    assert "Application startup complete." in served.stderr
    cold = cli.sim.run_vllm_server("--model", "llama-tiny", "--bucket", "512", "--graphs", "1", "--exit-when-ready",
                                   **pod)
    assert cold.returncode == 1 and "RuntimeError: compile cache miss" in cold.stderr
    assert len(cli.sim.compiles()) == 4


def test_warm_gives_the_server_the_cpu_compile_contract(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    show = ("import json, os; print('ENV', json.dumps({k: os.environ.get(k) for k in ('VLLM_NEURON_CPU_COMPILE', "
            "'NEURON_PLATFORM_TARGET_OVERRIDE', 'NEURON_LIBTORCH_REMOTE_CACHE', 'VLLM_CACHE_ROOT', "
            "'NEURON_LIBTORCH_PARALLEL_COMPILE_WORKERS', 'VLLM_NEURON_CPU_MODE', "
            "'NEURON_LIBTORCH_DISABLE_COMPILE_CACHE', 'VLLM_NEURON_DISABLE_WARMUP_COMPILE')}))")
    seen = []
    for extra in ([], ["--parallel", "3"]):
        report = cli.json("warm", "--instance", INSTANCE, "--store", str(store), "--quiet", *extra, "--",
                          sys.executable, "-c", show, VLLM_NEURON_CPU_MODE="1", VLLM_NEURON_DISABLE_WARMUP_COMPILE="1",
                          NEURON_LIBTORCH_DISABLE_COMPILE_CACHE="1")
        line = next(ln for ln in Path(report["groups"][0]["log"]).read_text().splitlines() if ln.startswith("ENV"))
        seen.append(json.loads(line[4:]))
        assert sum("unset VLLM_NEURON_CPU_MODE" in n for n in report["notes"]) == 1
        assert any("unset NEURON_LIBTORCH_DISABLE_COMPILE_CACHE" in n for n in report["notes"])
    plain, parallel = seen
    assert plain["VLLM_NEURON_CPU_COMPILE"] == "1" and plain["NEURON_PLATFORM_TARGET_OVERRIDE"] == "trn2"
    assert plain["NEURON_LIBTORCH_REMOTE_CACHE"] == str(store / NS)
    local = Path(plain["VLLM_CACHE_ROOT"])
    assert local.is_relative_to(os.environ["NEFFCACHE_LOCAL_ROOT"]) and not local.is_relative_to(store)
    assert local.name == f"vllm-{V1}"
    assert plain["NEURON_LIBTORCH_PARALLEL_COMPILE_WORKERS"] is None and parallel[
        "NEURON_LIBTORCH_PARALLEL_COMPILE_WORKERS"] == "3"
    for name in ("VLLM_NEURON_CPU_MODE", "NEURON_LIBTORCH_DISABLE_COMPILE_CACHE", "VLLM_NEURON_DISABLE_WARMUP_COMPILE"):
        assert plain[name] is None and parallel[name] is None


def test_warm_reports_events_to_the_index(cli: Cli, tmp_path: Path, index: Index) -> None:
    store = tmp_path / "store"
    assert cli.json(*vllm_warm_args(store))["totals"]["compiled"] == 4
    totals = index.stats()["warm_ups"]
    assert (totals["compiles"], totals["misses"], totals["hits"]) == (4, 4, 0)
    assert {e["path"] for e in index.entries()} == {f"{NS}/{e.key}" for e in healthy(store).entries}
    # A second host's warm-up fetches every graph from the shared tier: a hit each.
    assert cli.json(*vllm_warm_args(store))["totals"]["hits"] == 4
    totals = index.stats()["warm_ups"]
    assert (totals["compiles"], totals["misses"], totals["hits"]) == (4, 4, 4)


def test_a_server_that_fails_to_start_is_a_crashed_bucket(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    report = cli.json(*vllm_warm_args(store, buckets="128"), rc=1, NEFFSIM_FAIL_MATCH="g1$")
    (group,) = report["groups"]
    assert group["status"] == "crashed" and group["exit_code"] == 1
    assert "could not be compiled" in group["failures"][0]["reason"]
    # What it did compile before it gave up is kept and published.
    assert group["compiled"] == 1 and len(healthy(store).entries) == 1


def test_a_server_that_ignores_sigint_is_stopped_by_sigterm(tmp_path: Path) -> None:
    script = ("import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
              "print('INFO:     Uvicorn running on http://0.0.0.0:8000', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, process_group=0)
    assert proc.stdout is not None and b"Uvicorn running" in proc.stdout.readline()
    stop_ready_server(proc, grace=0.5)
    assert proc.returncode == -signal.SIGTERM  # SIGINT ignored, then SIGTERM (not the SIGKILL path)
    proc.stdout.close()
