"""Environment failures are not poison (aws-neuron-sdk #1023): a compile the host failed (killed,
out of memory, a compiler that cannot start, a missing library) is retried and never cached; a
compiler error is cached with its signature; a failure TTL gives a fixed compiler another chance.
Real subprocesses throughout: the `neffcache` CLI, the simulated workload and compiler."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from neffcache.entry import EntryState
from neffcache.failures import signature
from neffcache.layouts import get_layout
from neffcache.scan.report import scan
from neffcache.stores import open_store
from neffcache.stores.local import LocalStore
from neffcache.testing.hlo import make_hlo
from neffcache.toolchain import Toolchain
from neffcache.warmers.children import Children
from neffcache.warmers.compiling import CompileJob, CompilePool
from neffcache.warmers.placement import open_placement
from tests.warmers.conftest import V1, V2, Cli, graphs_compiled, healthy, warm_args


def _states(store: Path) -> dict[str, int]:
    states = [e.state for e in healthy(store).entries]
    return {s.value: states.count(s) for s in EntryState if states.count(s)}


def _logs(store: Path) -> list[Path]:
    return sorted(store.rglob("model.log"))


def test_two_phase_kill_and_oom_are_retried_and_never_cached(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = warm_args(store, "--two-phase", buckets="128", graphs=3)
    report = cli.json(*args, rc=1, NEFFSIM_KILL_MATCH="b128/g1$", NEFFSIM_OOM_MATCH="b128/g2$")
    kinds = sorted((f["kind"], f["attempts"]) for g in report["groups"] for f in g["failures"])
    assert kinds == [("environment", 3), ("environment", 3)]  # the first compile and ENV_RETRIES more
    reasons = " ".join(f["reason"] for g in report["groups"] for f in g["failures"])
    assert "killed by SIGKILL" in reasons and "out-of-memory" in reasons and "not cached" in reasons
    compiled = graphs_compiled(cli.sim)
    assert compiled.count("llama-tiny/b128/g1") == 3 and compiled.count("llama-tiny/b128/g2") == 3
    assert _logs(store) == [] and _states(store) == {"SUCCESS": 1, "EMPTY": 2}

    again = cli.json(*args)  # the host is fine now: compiled, no --retry-failed needed
    assert again["ok"] and again["totals"]["compiled"] == 2 and again["totals"]["hits"] == 1
    assert graphs_compiled(cli.sim).count("llama-tiny/b128/g1") == 4
    assert _states(store) == {"SUCCESS": 3}


def _broken_compiler(tmp_path: Path) -> tuple[Path, Path]:
    """A neuronx-cc that cannot start (its interpreter is gone: the shell's exit 127), counting
    every attempt to run it."""
    attempts = tmp_path / "attempts"
    script = tmp_path / "broken-bin" / "neuronx-cc-broken"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\necho "$$" >> {attempts}\nexec {tmp_path}/no-such-python -m x "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, attempts


def test_a_compiler_that_cannot_start_is_retried_and_never_cached(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    broken, attempts = _broken_compiler(tmp_path)
    args = warm_args(store, "--two-phase", "--compiler", str(broken), "--compiler-version", V1, buckets="128",
                     graphs=1)
    report = cli.json(*args, rc=1)
    (failure,) = [f for g in report["groups"] for f in g["failures"]]
    assert failure["kind"] == "environment" and failure["attempts"] == 3 and "compiler-missing" in failure["reason"]
    assert len(attempts.read_text().split()) == 3
    assert _logs(store) == [] and _states(store) == {"EMPTY": 1}
    fixed = cli.json(*warm_args(store, "--two-phase", buckets="128", graphs=1))
    assert fixed["ok"] and fixed["totals"]["compiled"] == 1 and graphs_compiled(cli.sim) == ["llama-tiny/b128/g0"]


def test_a_compiler_error_is_cached_with_its_signature(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = warm_args(store, "--two-phase", buckets="128", graphs=2)
    report = cli.json(*args, rc=1, NEFFSIM_FAIL_MATCH="b128/g1$")
    (failure,) = [f for g in report["groups"] for f in g["failures"]]
    assert failure["kind"] == "compile" and failure.get("attempts", 1) == 1
    (log,) = _logs(store)
    text = log.read_text()
    assert text.startswith("Failed compilation with [")  # the runtime's own form, with the command
    assert f"neffcache-failure: compiler-error (compiler) signature {failure['signature']}" in text
    assert signature(get_layout("neuronxcc").read_failure_log(log.read_bytes()).output) == failure["signature"]
    scanned = json.loads(cli.run("scan", str(store), "--json").stdout)["failures"]
    assert (scanned["compiler"], scanned["environment"]) == (1, 0)
    assert scanned["entries"][0]["signature"] == failure["signature"]
    cached = cli.json(*args, rc=1)  # fault gone, the compiler error still stands, as the runtime has it
    assert cached["totals"]["failed"] == 1 and cached["totals"]["compiled"] == 0
    assert failure["signature"] in json.dumps(cached["groups"])
    assert graphs_compiled(cli.sim).count("llama-tiny/b128/g1") == 1


def _age(paths: list[Path], days: float) -> None:
    then = time.time() - days * 86400
    for path in paths:
        os.utime(path, (then, then))


@pytest.mark.parametrize("mode", ["two-phase", "one-phase"])
def test_an_old_compiler_error_compiles_again_past_the_failure_ttl(cli: Cli, tmp_path: Path, mode: str) -> None:
    store = tmp_path / "store"
    phase = ["--two-phase"] if mode == "two-phase" else []
    args = warm_args(store, *phase, buckets="128", graphs=2)
    cli.json(*args, rc=1, NEFFSIM_FAIL_MATCH="b128/g1$")
    assert len(_logs(store)) == 1
    _age(_logs(store), days=3)
    not_yet = cli.json(*warm_args(store, *phase, "--failed-ttl", "7d", buckets="128", graphs=2), rc=1)
    assert not_yet["totals"]["failed"] == 1  # not old enough yet
    fixed = cli.json(*args, NEFFCACHE_FAILED_TTL="2d")  # the compiler was fixed since: another chance
    assert fixed["ok"] and fixed["totals"]["compiled"] == 1
    assert graphs_compiled(cli.sim).count("llama-tiny/b128/g1") == 2
    assert _logs(store) == [] and _states(store) == {"SUCCESS": 2}


def test_one_phase_a_killed_compile_leaves_no_cached_failure(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = warm_args(store, buckets="128", graphs=2)
    report = cli.json(*args, rc=1, NEFFSIM_KILL_MATCH="b128/g1$")
    (failure,) = [f for g in report["groups"] for f in g["failures"]]
    assert failure["kind"] == "environment" and "killed" in failure["reason"] and "cleared" in failure["reason"]
    assert _logs(store) == [] and _states(store) == {"SUCCESS": 1, "EMPTY": 1}
    again = cli.json(*args)
    assert again["ok"] and again["totals"]["compiled"] == 1
    assert graphs_compiled(cli.sim).count("llama-tiny/b128/g1") == 2


def test_one_phase_clears_the_environment_failures_a_runtime_left_and_keeps_compiler_errors(
        cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    # A training job, without neffcache, whose host lacked a library: every compile "failed".
    proc = cli.workload(store, "--model", "llama-tiny", "--bucket", "128", "--graphs", "2",
                        NEFFSIM_ENV_FAIL_MATCH="libfoo")
    assert proc.returncode == 1 and len(_logs(store)) == 2
    # And one whose compiler rejected a graph of another bucket.
    proc = cli.workload(store, "--model", "llama-tiny", "--bucket", "256", "--graphs", "1",
                        NEFFSIM_FAIL_MATCH="b256/g0")
    assert proc.returncode == 1 and len(_logs(store)) == 3
    report = cli.json(*warm_args(store, "--allow-failures", buckets="128,256", graphs=1))
    assert any("cleared 2 failure log(s)" in n for n in report["notes"])
    rows = {g["name"]: g for g in report["groups"]}
    assert rows["SEQ=128"]["status"] == "ok" and rows["SEQ=128"]["compiled"] == 1
    (cached,) = rows["SEQ=256"]["failures"]
    assert cached["kind"] == "compile" and len(cached["signature"]) == 16
    assert len(_logs(store)) == 1  # the compiler error stands; b128/g1 (not in this warm) is EMPTY again
    assert _states(store) == {"SUCCESS": 1, "FAILED": 1, "EMPTY": 1}


def test_rewarm_retries_a_killed_compile_and_an_old_compiler_error_gets_another_chance(
        cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert cli.json(*warm_args(store, "--two-phase", buckets="128", graphs=3))["ok"]
    cli.bump(V2)
    rewarm = ["rewarm", "--from-compiler", V1, "--store", str(store), "--layout", "neuronxcc", "-q"]
    first = cli.json(*rewarm, rc=1, NEFFSIM_KILL_MATCH="g1$", NEFFSIM_FAIL_MATCH="g2$")
    kinds = sorted(f["kind"] for g in first["groups"] for f in g["failures"])
    assert kinds == ["compile", "environment"]
    v2_logs = [p for p in _logs(store) if V2 in str(p)]
    assert len(v2_logs) == 1 and "NCC_ESIM001" in v2_logs[0].read_text()  # only the compiler error is cached
    second = cli.json(*rewarm, rc=1)  # the killed graph compiles; the compiler error stands
    assert second["totals"]["compiled"] == 1 and second["totals"]["failed"] == 1
    _age(v2_logs, days=10)
    third = cli.json(*rewarm, "--failed-ttl", "1d")  # a fixed compiler: another chance
    assert third["ok"] and third["totals"]["compiled"] == 1
    assert [r["graph"] for r in cli.sim.compiles() if r["version"] == V2].count("llama-tiny/b128/g2") == 2


# -- the pool, in process ----------------------------------------------------------------------
TC = Toolchain("2.21.33363.0+82129205", "trn2", 2)
NS = get_layout("neuronxcc").namespace_for(TC)


def test_the_pool_retries_a_compiler_gone_missing_with_backoff(tmp_path: Path) -> None:
    from tests.runtime_caches import write_neuronxcc_entry

    root = tmp_path / "store"
    entry = write_neuronxcc_entry(root / "trn2-lnc2", make_hlo("m", 1, 0, 1000), state="EMPTY",
                                  version=TC.compiler_version, flags="--model-type=transformer")
    path = str(entry.relative_to(root))
    placement = open_placement([str(root)], index_url=None, token=None, spool_root=tmp_path / "spool")
    try:
        job = CompileJob("b", NS, entry.name, placement.work, f"{path}/model.hlo_module.pb",
                         ("--model-type=transformer",), TC)
        started = time.monotonic()
        (outcome,) = CompilePool(placement, tmp_path / "gone" / "neuronx-cc", Children(), env_retries=2,
                                 retry_backoff=0.3).run([job])
        waited = time.monotonic() - started
    finally:
        placement.close()
    assert outcome.status == "environment" and outcome.attempts == 3
    assert outcome.verdict is not None and outcome.verdict.cause == "compiler-missing"
    assert waited >= 0.3 + 0.6  # backoff doubled between the attempts
    (found,) = scan(LocalStore(root)).entries
    assert found.state is EntryState.EMPTY and not _logs(root)
    assert open_store(str(root)).stat(f"{path}/model.log") is None

