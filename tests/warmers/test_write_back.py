"""`neffcache push LOCAL SHARED --watch` (issue 36): the write-back sidecar beside a job.

Real processes: the watcher runs while the simulated runtime compiles into the node-local tier;
what it commits reaches the shared store, what is still compiling (its lock held) or has no
commit marker never does, and SIGTERM drains and ends the watcher with exit 0. Timing is not
asserted here (a loaded machine may take longer): bench/ measures the lag.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from neffcache.entry import EntryState
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from tests.runtime_caches import write_neuronxcc_entry, write_vllm_entry
from tests.warmers.conftest import INSTANCE, WORKLOAD, Cli, summary

PATIENCE = 180.0  # seconds a loaded CI machine may need; the bench measures the real lag


def _wait_for(predicate: object, what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"never happened: {what}")


def _entries(root: Path) -> dict[str, EntryState]:
    if not root.exists():
        return {}
    return {e.path: e.state for e in scan(LocalStore(root)).entries}


def test_what_the_job_commits_is_published_and_sigterm_drains(cli: Cli, tmp_path: Path) -> None:
    local, shared = tmp_path / "nvme", tmp_path / "shared"
    local.mkdir()
    # Not committed: a compile holding its lock, a vLLM entry without its marker.
    locked = write_neuronxcc_entry(local / "trn2-lnc2", b"still compiling", state="LOCKED")
    write_vllm_entry(local / "trn2-lnc2" / "vllm-2.27.5334.0+f702b353", "half", complete=False)
    watcher = cli.popen("push", str(local), str(shared), "--watch", "--interval", "0.5", "--json")
    try:
        env = json.loads(cli.run("env", "--instance", INSTANCE, "--store", str(local), "--shell", "json").stdout)["env"]
        for backend in ("xla", "native"):
            job = subprocess.run([*WORKLOAD, "--backend", backend, "--model", "llama-tiny", "--bucket", "128,256",
                                  "--graphs", "2"], env=cli.environ(**env), capture_output=True, text=True,
                                 timeout=120, check=False)
            assert job.returncode == 0 and summary(job.stderr)["compiled"] == 4, job.stderr
        committed = {p for p, s in _entries(local).items() if s is EntryState.SUCCESS}
        assert len(committed) == 8
        _wait_for(lambda: committed <= set(_entries(shared)), "the job's entries published")
        # One more entry while it runs: published too.
        late = write_neuronxcc_entry(local / "trn2-lnc2", b"late graph")
        _wait_for(lambda: str(late.relative_to(local)) in _entries(shared), "a late entry published")
    finally:
        watcher.send_signal(signal.SIGTERM)
        out, err = watcher.communicate(timeout=PATIENCE)
    assert watcher.returncode == 0, err
    report = json.loads(out)
    assert report["drained"] is True and report["published"] == 9 and report["failed"] == []
    assert report["lag_p50"] is not None
    published = _entries(shared)
    assert all(state is EntryState.SUCCESS for state in published.values())
    assert str(locked.relative_to(local)) not in published
    assert not any("vllm" in p for p in published)
    assert scan(LocalStore(shared), read_manifests=True).entries[0].manifest is not None


def test_a_watcher_started_on_an_empty_tier_and_stopped_at_once_exits_zero(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "nvme").mkdir()
    watcher = cli.popen("push", str(tmp_path / "nvme"), str(tmp_path / "shared"), "--watch", "--json")
    assert watcher.stderr is not None
    while not watcher.stderr.readline().startswith("watching "):  # then its handlers are installed
        assert watcher.poll() is None, watcher.stderr.read()
    watcher.send_signal(signal.SIGINT)
    out, err = watcher.communicate(timeout=PATIENCE)
    assert watcher.returncode == 0, err
    assert json.loads(out)["published"] == 0
    assert os.path.isdir(tmp_path / "shared")
