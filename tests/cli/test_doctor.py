"""``neffcache doctor`` finds each planted problem and passes on a healthy setup.

Real parts: the CLI as a subprocess with the simulated neuronx-cc first on PATH, a real
uvicorn index server with real tokens, moto's S3 server over HTTP, and a read-only bind mount
for the store that cannot be written (the tests run as root, where permission bits stop
nothing; a read-only mount stops root too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neffcache.application.doctor import _skew_finding
from neffcache.application.findings import Level
from tests.server.conftest import ServerProcess, Tokens, free_port
from tests.simulation import Sim, make_sim
from tests.stores.conftest import aws_env, moto_server, s3_endpoint  # noqa: F401 - fixtures
from tests.stores.moto_server import S3TestServer

BUCKET = "neffcache-test"


def doctor(sim: Sim, *args: str, **env: str) -> tuple[int, dict[str, object]]:
    proc = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "doctor", *args, "--json"],
                          env={**sim.env, **env}, capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def levels(report: dict[str, object]) -> dict[str, str]:
    findings = report["findings"]
    assert isinstance(findings, list)
    return {f["check"]: f["level"] for f in findings}


@pytest.fixture
def sim(tmp_path: Path) -> Sim:
    made = make_sim(tmp_path)
    # The simulation points NEURON_COMPILE_CACHE_URL at an unmanaged directory: a healthy job
    # environment has no cache variables until `neffcache run`/`env` sets them.
    made.env.pop("NEURON_COMPILE_CACHE_URL", None)
    return made


def test_a_healthy_setup_passes(sim: Sim, tmp_path: Path, index: tuple[ServerProcess, Tokens],
                                s3_endpoint: str) -> None:  # noqa: F811
    server, tokens = index
    url = server.url
    store = tmp_path / "store"
    store.mkdir()
    code, report = doctor(sim, "--instance", "trn2.48xlarge", "--store", str(store), "--store", f"s3://{BUCKET}/cache",
                          "--endpoint-url", s3_endpoint, "--index-url", url, "--token", tokens.write,
                          AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    assert code == 0, report
    assert report["worst"] == "ok"
    found = levels(report)
    assert found["compiler"] == "ok" and found["instance"] == "ok"
    assert found[f"store {store}"] == "ok" and found[f"store s3://{BUCKET}/cache"] == "ok"
    assert found["index token"] == "ok"
    # The write test cleaned up after itself, on disk and in the bucket.
    assert not any(p.is_file() for p in store.rglob("*"))


def test_a_read_only_store_is_a_problem(sim: Sim, tmp_path: Path) -> None:
    source, mounted = tmp_path / "source", tmp_path / "ro"
    source.mkdir()
    mounted.mkdir()
    bind = subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(mounted)], capture_output=True, text=True,
                          check=False)
    if bind.returncode != 0:
        if os.environ.get("NEFFCACHE_REQUIRE_SERVICES"):
            pytest.fail(f"cannot make a read-only bind mount: {bind.stderr}")
        pytest.skip(f"a read-only bind mount needs root: {bind.stderr.strip()}")
    try:
        code, report = doctor(sim, "--instance", "trn2.48xlarge", "--store", str(mounted))
    finally:
        subprocess.run(["umount", str(mounted)], check=True)
    assert code == 11, report
    problem = next(f for f in report["findings"] if f["check"] == f"store {mounted}")  # type: ignore[union-attr]
    assert problem["level"] == "problem" and "not writable" in problem["message"], problem
    assert problem["fix"]


def test_a_symlinked_control_directory_is_a_problem_not_a_crash(sim: Sim, tmp_path: Path) -> None:
    store, outside = tmp_path / "store", tmp_path / "outside"
    store.mkdir()
    outside.mkdir()
    (store / ".neffcache").symlink_to(outside)
    code, report = doctor(sim, "--instance", "trn2.48xlarge", "--store", str(store))
    assert code == 11, report
    assert levels(report)[f"store {store}"] == "problem"
    assert list(outside.iterdir()) == []  # the test write did not land through the link


def test_a_cache_dir_in_neuron_cc_flags_is_a_warning(sim: Sim, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    code, report = doctor(sim, "--instance", "trn2.48xlarge", "--store", str(store),
                          NEURON_CC_FLAGS="--model-type=transformer --cache_dir=/scratch/cache")
    assert code == 10, report
    assert levels(report)["env NEURON_CC_FLAGS"] == "warning"


def test_settings_that_silently_turn_a_cache_off_are_named(sim: Sim, tmp_path: Path) -> None:
    """libneuronxla's --no_cache and TorchNeuron's TORCH_NEURONX_NEFF_DISABLE_CACHE: a job would run
    and compile every graph, keeping none; doctor says which setting and how to fix it, and so
    does env (as a note beside the exports)."""
    store = tmp_path / "store"
    store.mkdir()
    code, report = doctor(sim, "--instance", "trn2.48xlarge", "--store", str(store),
                          NEURON_CC_FLAGS="--model-type=transformer --no_cache", TORCH_NEURONX_NEFF_DISABLE_CACHE="1")
    assert code == 10, report
    found = {f["check"]: f for f in report["findings"]}
    assert "--no_cache" in found["env NEURON_CC_FLAGS"]["message"] and "remove --no_cache" in found[
        "env NEURON_CC_FLAGS"]["fix"]
    assert "disk cache off" in found["env TORCH_NEURONX_NEFF_DISABLE_CACHE"]["message"]
    env = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "env", "--instance", "trn2.48xlarge",
                          "--store", str(store)], env={**sim.env, "NEURON_CC_FLAGS": "--no_cache"},
                         capture_output=True, text=True, timeout=120, check=False)
    assert env.returncode == 0, env.stderr
    assert "--no_cache in NEURON_CC_FLAGS turns libneuronxla's persistent cache off" in env.stdout + env.stderr


def test_an_unversioned_cache_variable_is_a_warning(sim: Sim, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    code, report = doctor(sim, "--store", str(store), "--instance", "trn2.48xlarge",
                          TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "neff"))
    assert code == 10, report
    assert levels(report)["env TORCH_NEURONX_NEFF_CACHE_DIR"] == "warning"


def test_an_lnc_mismatch_is_a_problem(sim: Sim, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    code, report = doctor(sim, "--store", str(store), "--instance", "trn2.48xlarge", NEURON_LOGICAL_NC_CONFIG="1")
    assert code == 11, report
    assert levels(report)["lnc"] == "problem"


def test_an_index_that_is_down_is_a_warning(sim: Sim, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    code, report = doctor(sim, "--instance", "trn2.48xlarge", "--store", str(store),
                          "--index-url", f"http://127.0.0.1:{free_port()}", "--token", "whatever")
    assert code == 10, report
    assert levels(report)["index"] == "warning"


def test_tokens_that_cannot_write_are_found(sim: Sim, tmp_path: Path, index: tuple[ServerProcess, Tokens]) -> None:
    server, tokens = index
    url = server.url
    store = tmp_path / "store"
    store.mkdir()
    code, report = doctor(sim, "--instance", "trn2.48xlarge", "--store", str(store), "--index-url", url,
                          "--token", tokens.read)
    assert code == 10, report
    assert levels(report)["index token"] == "warning"
    code, report = doctor(sim, "--instance", "trn2.48xlarge", "--store", str(store), "--index-url", url,
                          "--token", "not-a-token")
    assert code == 11, report
    assert levels(report)["index token"] == "problem"


def test_no_compiler_and_a_missing_store(tmp_path: Path, moto_server: S3TestServer) -> None:  # noqa: F811
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "TORCH_NEURONX_"))}
    env["PATH"] = os.path.dirname(sys.executable)  # python, but no neuronx-cc
    proc = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "doctor", "--instance", "trn9.huge",
                           "--store", str(tmp_path / "absent"), "--json"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    report = json.loads(proc.stdout)
    assert proc.returncode == 11
    found = levels(report)
    assert found["compiler"] == "warning"
    assert found["instance"] == "problem"
    assert found[f"store {tmp_path / 'absent'}"] == "problem"


@pytest.mark.parametrize(("skew", "level"), [(0.5, Level.OK), (-12.0, Level.WARNING), (600.0, Level.PROBLEM)])
def test_clock_skew_levels(skew: float, level: Level) -> None:
    finding = _skew_finding("store x clock", skew, "the store's")
    assert finding.level is level
    assert ("ahead" if skew > 0 else "behind") in finding.message


def test_vllm_settings_that_defeat_its_cache_are_warnings(sim: Sim, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    code, report = doctor(sim, "--instance", "trn2.48xlarge", "--store", str(store),
                          NEURON_LIBTORCH_DISABLE_COMPILE_CACHE="1", VLLM_NEURON_CPU_COMPILE="1",
                          VLLM_NEURON_CPU_MODE="1", NEURON_LIBTORCH_REMOTE_CACHE="s3://bucket/cache",
                          VLLM_CACHE_ROOT=str(store / "trn2-lnc2" / "vllm-x"))
    assert code == 10, report
    found = levels(report)
    for name in ("NEURON_LIBTORCH_DISABLE_COMPILE_CACHE", "VLLM_NEURON_CPU_COMPILE", "NEURON_LIBTORCH_REMOTE_CACHE",
                 "VLLM_CACHE_ROOT"):
        assert found[f"env {name}"] == "warning", name
    findings = report["findings"]
    assert isinstance(findings, list)
    text = " ".join(f["message"] for f in findings)
    assert "NEURON_LIBTORCH_DISABLE_COMPILE_CACHE=1 turns vLLM-Neuron's compile cache off" in text
    assert "inside the shared store" in text
