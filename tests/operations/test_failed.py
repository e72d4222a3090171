"""Reading a store's failed entries: each log judged (compiler error or environment) and signed,
written by the simulated runtime itself (a second writer, not neffcache), read in bounded memory."""

from __future__ import annotations

import os
import time
from pathlib import Path

from neffcache.entry import EntryState
from neffcache.failures import FailureCause, FailureClass
from neffcache.operations.failed import failed_graphs, read_log, standing_failure, store_failures
from neffcache.scan.report import scan
from neffcache.stores import open_store
from tests.runtime_caches import write_neuronxcc_entry
from tests.simulation import Sim


def _run(sim: Sim, root: Path, *args: str, **env: str) -> None:
    proc = sim.run_workload("--model", "llama", "--bucket", "128", "--graphs", "3", *args,
                            NEURON_COMPILE_CACHE_URL=str(root), **env)
    assert "graphs=3" in proc.stderr, proc.stderr


def test_the_runtimes_own_failure_logs_are_judged_by_cause(sim: Sim, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    # One run per fault: the simulated runtime records each failure as libneuronxla does.
    _run(sim, root, NEFFSIM_FAIL_MATCH="g0", NEFFSIM_KILL_MATCH="g1", NEFFSIM_OOM_MATCH="g2")
    store = open_store(str(root))
    failed = {f.verdict.cause: f for f in store_failures(store)}
    assert set(failed) == {FailureCause.COMPILER_ERROR, FailureCause.KILLED, FailureCause.OUT_OF_MEMORY}
    error = failed[FailureCause.COMPILER_ERROR]
    assert error.verdict.failure_class is FailureClass.COMPILER and "NCC_ESIM001" in error.message
    assert error.command is not None and error.command[:2] == ("neuronx-cc", "compile")
    assert failed[FailureCause.KILLED].verdict.failure_class is FailureClass.ENVIRONMENT
    now = time.time()
    assert error.stands(now, None) and error.stands(now, 3600) and not error.stands(now + 7200, 3600)
    assert not failed[FailureCause.KILLED].stands(now, None)  # the host failed it: never stands
    assert standing_failure(store, failed[FailureCause.OUT_OF_MEMORY].entry, ttl=None) is None
    assert standing_failure(store, error.entry, ttl=None) == error


def test_a_missing_shared_library_leaves_an_environment_failure(sim: Sim, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    proc = sim.run_workload("--model", "llama", "--bucket", "128", "--graphs", "1",
                            NEURON_COMPILE_CACHE_URL=str(root), NEFFSIM_ENV_FAIL_MATCH="libfoo")
    assert "failed=1" in proc.stderr, proc.stderr
    (got,) = store_failures(open_store(str(root)))
    assert got.verdict.cause is FailureCause.MISSING_LIBRARY and "libfoo.so.1" in got.verdict.detail


def test_a_runaway_log_is_read_in_bounded_memory(tmp_path: Path) -> None:
    entry = write_neuronxcc_entry(tmp_path, b"HLO", state="FAILED")
    log = entry / "model.log"
    log.write_bytes(b"Failed compilation with ['neuronx-cc']: " + b"progress ....\n" * 400_000
                    + b"ERROR: the real error at the end\n")
    store = open_store(str(tmp_path))
    data = read_log(store, str(log.relative_to(tmp_path)))
    assert len(data) < 300 * 1024 and data.startswith(b"Failed compilation with") and b"real error" in data
    (failed,) = failed_graphs(store, scan(store).entries)
    assert failed.message == "ERROR: the real error at the end"


def test_since_leaves_out_older_failures_and_a_gone_log_is_skipped(tmp_path: Path) -> None:
    old = write_neuronxcc_entry(tmp_path, b"old", state="FAILED")
    write_neuronxcc_entry(tmp_path, b"new", state="FAILED")
    os.utime(old / "model.log", (time.time() - 86400 * 10,) * 2)
    store = open_store(str(tmp_path))
    assert len(store_failures(store)) == 2
    assert len(store_failures(store, since=time.time() - 86400)) == 1
    entries = [e for e in scan(store).entries if e.state is EntryState.FAILED]
    (old / "model.log").unlink()  # retried and replaced between the listing and the read
    assert len(failed_graphs(store, entries)) == 1
