"""A failing compile, a hanging compile, a crashing or overrunning workload: each reported
clearly, the rest of the work completes, no half entry and no process is left behind."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from neffcache.entry import EntryState
from tests.warmers.conftest import INSTANCE, WORKLOAD, Cli, graphs_compiled, healthy, warm_args


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _no_compiler_left(cli: Cli) -> None:
    alive = [r for r in cli.sim.compiles() if _alive(int(str(r["pid"])))]
    assert not alive, alive


def _groups(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["name"]: g for g in report["groups"]}


def test_one_phase_fail_hang_and_crash(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    matrix = tmp_path / "matrix.json"
    matrix.write_text(json.dumps({"include": [{"SEQ": 128, "MODE": "--graphs=3"}, {"SEQ": 256, "MODE": "--graphs=3"},
                                              {"SEQ": 512, "MODE": "--crash-after=1"}]}))
    args = ["warm", "--instance", INSTANCE, "--store", str(store), "--matrix", str(matrix), "--parallel", "3",
            "--compile-timeout", "6", "-q", "--", *WORKLOAD, "--bucket", "{SEQ}", "{MODE}"]
    faults = {"NEFFSIM_FAIL_MATCH": "b128/g1", "NEFFSIM_HANG_MATCH": "b256/g2"}
    report = cli.json(*args, rc=1, **faults)
    groups = _groups(report)
    failed = groups["SEQ=128,MODE=--graphs=3"]
    assert (failed["status"], failed["compiled"], failed["failed"]) == ("failed", 2, 1)
    assert failed["failures"][0]["kind"] == "compile" and "NCC_ESIM001" in failed["failures"][0]["reason"]
    hung = groups["SEQ=256,MODE=--graphs=3"]
    assert (hung["status"], hung["compiled"], hung["failed"]) == ("failed", 2, 1)
    assert hung["failures"][0]["kind"] == "timeout" and "--compile-timeout 6s" in hung["failures"][0]["reason"]
    crashed = groups["SEQ=512,MODE=--crash-after=1"]
    assert (crashed["status"], crashed["compiled"], crashed["exit_code"]) == ("crashed", 1, 3)
    assert crashed["failures"][0]["kind"] == "crash" and "exited 3" in crashed["failures"][0]["reason"]
    assert Path(crashed["log"]).is_file()
    _no_compiler_left(cli)
    states = [e.state for e in healthy(store).entries]
    # The compiler error is cached as the runtime caches it; the compile the watchdog killed left
    # a failure log too (the runtime cannot tell), which neffcache judged and cleared.
    assert (states.count(EntryState.SUCCESS), states.count(EntryState.FAILED), states.count(EntryState.EMPTY)) \
        == (5, 1, 1)

    # The compiler error is reported again (--allow-failures exits 0); the killed one is compiled again.
    again = cli.json(*args[:1], "--allow-failures", *args[1:], **faults)
    assert again["totals"]["compiled"] == 0 and again["totals"]["failed"] == 2 and not again["ok"]
    # Once the compiler is fixed, --retry-failed compiles them.
    fixed = cli.json(*args[:1], "--retry-failed", "--allow-failures", *args[1:])
    assert _groups(fixed)["SEQ=128,MODE=--graphs=3"]["status"] == "ok" and fixed["totals"]["compiled"] == 2


def test_two_phase_fail_and_hang_then_retry(cli: Cli, tmp_path: Path) -> None:
    """A compiler error is cached (with its signature); a timed-out compile is an environment
    failure: nothing cached, the next run compiles it without --retry-failed."""
    store = tmp_path / "store"
    args = warm_args(store, "--two-phase", "--parallel", "3", "--compile-timeout", "6", graphs=3)
    report = cli.json(*args, rc=1, NEFFSIM_FAIL_MATCH="b128/g1", NEFFSIM_HANG_MATCH="b256/g2")
    failures = {f["kind"]: f for g in report["groups"] for f in g["failures"]}
    assert sorted((f["group"], k) for k, f in failures.items()) == [("SEQ=128", "compile"), ("SEQ=256", "timeout")]
    assert report["totals"]["compiled"] == 4
    assert "NCC_ESIM001" in failures["compile"]["reason"] and len(failures["compile"]["signature"]) == 16
    assert "timed out after 6s" in failures["timeout"]["reason"] and "not cached" in failures["timeout"]["reason"]
    _no_compiler_left(cli)
    states = [e.state for e in healthy(store).entries]
    assert (states.count(EntryState.SUCCESS), states.count(EntryState.FAILED), states.count(EntryState.EMPTY)) \
        == (4, 1, 1)

    cached = cli.json(*args, rc=1)
    assert cached["totals"]["failed"] == 1 and cached["totals"]["compiled"] == 1  # the timed-out graph
    assert "--retry-failed" in json.dumps(cached["groups"])
    assert graphs_compiled(cli.sim).count("llama-tiny/b256/g2") == 2
    retried = cli.json(*args[:1], "--retry-failed", *args[1:])
    assert retried["ok"] and retried["totals"]["compiled"] == 1 and retried["totals"]["hits"] == 5
    states = [e.state for e in healthy(store).entries]
    assert states == [EntryState.SUCCESS] * 6


@pytest.mark.parametrize("backend", ["xla", "native"])
def test_a_workload_past_its_timeout_is_stopped_and_leaves_no_lock(cli: Cli, tmp_path: Path, backend: str) -> None:
    store = tmp_path / "store"
    report = cli.json(*warm_args(store, "--timeout", "3", backend=backend), rc=1, NEFFSIM_COMPILE_SECONDS="30")
    assert {g["status"] for g in report["groups"]} == {"timeout"}
    assert all(g["failures"][0]["kind"] == "timeout" for g in report["groups"])
    assert report["seconds"] < 20
    _no_compiler_left(cli)
    healthy(store)


@pytest.mark.parametrize("left", ["lock", "neff"])
def test_what_a_killed_runtime_left_is_cleaned_up(tmp_path: Path, left: str) -> None:
    from neffcache.layouts import get_layout
    from neffcache.scan.report import load_entry
    from neffcache.stores import open_store
    from neffcache.toolchain import Toolchain
    from neffcache.warmers.logscan import LogCounter, compile_patterns
    from neffcache.warmers.report import GroupReport
    from neffcache.warmers.workload import WorkloadRun, clean_after_dead_workload
    from tests.runtime_caches import write_neuronxcc_entry

    root = tmp_path / "store"
    toolchain = Toolchain("2.21.33363.0+82129205", "trn2", 2)
    entry_dir = write_neuronxcc_entry(root / "trn2-lnc2", b"HLO" * 100, state="LOCKED" if left == "lock" else "EMPTY")
    if left == "neff":
        (entry_dir / "model.neff").write_bytes(b"NEFF" * 100)  # killed between model.neff and model.done
    counter = LogCounter(compile_patterns(), str(root), [get_layout("neuronxcc").namespace_for(toolchain)])
    counter.feed(f"INFO ||NEURON_CC_WRAPPER||: Call compiler with cmd: neuronx-cc compile --target=trn2 "
                 f"{entry_dir}/model.hlo_module.pb --output {entry_dir}/model.neff")
    store = open_store(str(root))
    path = str(entry_dir.relative_to(root))
    run = WorkloadRun(GroupReport("b"), counter, started=entry_dir.stat().st_mtime - 5)
    assert clean_after_dead_workload(store, run) == [path]
    found = load_entry(store, path)
    assert found is not None and found.state is EntryState.EMPTY
