"""kill -9 at any instant leaves no partial entry visible; N publishers, one winner; leases."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neffcache.coordination.lease import LeaseRecord, acquire, lease_path, read_lease, try_acquire
from neffcache.entry import EntryState
from neffcache.operations.verify import CheckStatus, check_entry
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore

REPO = Path(__file__).resolve().parents[2]


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.operations.publisher", *args], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True], ids=["local", "shared"])
def test_sigkill_never_leaves_a_visible_partial_entry(tmp_path: Path, shared: bool) -> None:
    url = f"fsx://{tmp_path / 'c'}" if shared else str(tmp_path / "c")
    store = LocalStore(tmp_path / "c", shared=shared)
    rng = random.Random(1234)
    garbage_seen = 0
    verified: set[str] = set()
    trials = 50
    for trial in range(trials):
        proc = spawn("loop", url, "--prefix", f"t{trial}-", "--size", str(rng.choice([1, 2, 6]) << 20))
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.25))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        report = scan(store, read_manifests=True)
        for entry in report.entries:
            # Everything a reader can see is whole: committed and matching its manifest.
            assert entry.state is EntryState.SUCCESS, (entry.path, entry.state, entry.problems)
            if entry.path not in verified:  # earlier trials' entries were hashed already
                assert check_entry(store, entry).status is CheckStatus.OK, entry.path
                verified.add(entry.path)
        garbage_seen = max(garbage_seen, report.garbage_count)
    print(f"\n{trials} kills: {len(report.entries)} entries visible and verified, "
          f"{report.garbage_count} garbage items ({len(report.garbage)} temp files, "
          f"{len(report.uncommitted)} uncommitted entries) for prune")
    assert report.entries, "no publish completed in 50 trials: the test did not exercise anything"
    assert garbage_seen > 0, "no kill landed inside a write: the test did not exercise the window"

    # The dead publishers' leases do not block anyone: republishing the same keys completes.
    before = len(report.entries)
    rerun = spawn("loop", url, "--prefix", "t0-", "--count", "4", "--size", str(1 << 20))
    rerun.communicate(timeout=60)
    assert rerun.returncode == 0
    assert len(scan(store).entries) >= before


@pytest.mark.slow
def test_eight_processes_publish_one_entry(tmp_path: Path) -> None:
    start = tmp_path / "go"
    url = str(tmp_path / "c")
    procs = [spawn("one", url, "--start-file", str(start), "--seed", f"writer-{i}", "--size", str(2 << 20))
             for i in range(8)]
    time.sleep(1.5)  # let every interpreter start and spin on the start file
    start.touch()
    outcomes = []
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        outcomes.append(out.strip())
    assert outcomes.count("published") == 1, outcomes
    assert set(outcomes) <= {"published", "exists", "busy"}
    store = LocalStore(tmp_path / "c")
    (entry,) = scan(store, read_manifests=True).entries
    assert check_entry(store, entry).status is CheckStatus.OK
    assert entry.manifest is not None and entry.manifest.tags["pid"] in {str(p.pid) for p in procs}


def test_lease_of_dead_holder_taken_over(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    proc = spawn("hold-lease", str(tmp_path / "c"))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    got = try_acquire(store, "compile:held", owner="me")
    assert isinstance(got, LeaseRecord) and got.pid == proc.pid  # alive, heartbeating: not taken
    time.sleep(1.5)  # past the ttl, but the heartbeat kept renewing it
    assert isinstance(try_acquire(store, "compile:held", owner="me"), LeaseRecord)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    lease = acquire(store, "compile:held", wait=5)  # same host, dead pid: taken over at once
    assert lease.record.owner != got.owner
    lease.release()


def test_lease_of_other_host_waits_for_expiry(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    now = time.time()
    foreign = LeaseRecord("compile:x", "other-host:1", "tok", "other-host", 1, now, now + 0.6)
    store.put_file(lease_path("compile:x"), foreign.to_bytes())
    assert isinstance(try_acquire(store, "compile:x"), LeaseRecord)  # cannot see its pid: wait
    time.sleep(0.7)
    lease = acquire(store, "compile:x")
    current = read_lease(store, "compile:x")
    assert current is not None and current.token == lease.record.token
    lease.release()


def test_torn_lease_file_is_taken_over(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    store.put_file(lease_path("compile:t"), b"{not json")
    lease = acquire(store, "compile:t")
    assert lease.record.name == "compile:t"
    lease.release()
