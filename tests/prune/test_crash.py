"""A prune killed with SIGKILL leaves nothing a reader could take for an entry, and a rerun
finishes; a prune racing publishers loses no entry published after its plan."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neffcache.entry import EntryState
from neffcache.operations.verify import CheckStatus, check_entry
from neffcache.prune import JOURNAL_DIR, PHASE_PAUSE_ENV, PrunePolicy, Reason, execute_plan, plan_prune
from neffcache.scan.report import scan
from neffcache.stores.base import TEMP_MARKER, Store
from tests.prune.helpers import NEW, TC_OLD, published_a, runtime_a
from tests.prune.procs import publish_key

REPO = Path(__file__).resolve().parents[2]


def spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.prune.procs", *args], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def fill(store: Store, trial: int) -> dict[str, set[str]]:
    """Old-toolchain entries, runtime-written and published; entry path -> its files."""
    for i in range(240):
        runtime_a(store, f"rt-{trial}-{i}".encode())
    for i in range(60):
        published_a(store, f"MODULE_{trial}{i:04d}+abb26765", TC_OLD, size=256)
    return {e.path: set(e.files) for e in scan(store).entries}


@pytest.mark.slow
def test_sigkill_mid_prune_then_rerun(fs_store: Store) -> None:
    store = fs_store
    url = store.url
    journal_dir = store.local_path(JOURNAL_DIR)
    assert journal_dir is not None
    rng = random.Random(6)
    interrupted_seen = 0
    # The kill lands at a random instant; keep trying (a few times at most) until one landed
    # inside a removal, so a fast machine cannot make the test miss the window it is about.
    trials = 1 if store.shared else 3  # type: ignore[attr-defined]  # shared: fsync per lease
    for trial in range(8):
        if trial >= trials and interrupted_seen:
            break
        original = fill(store, trial)
        keep = runtime_a(store, f"keep-{trial}".encode(), version=NEW)
        # Each removal phase is followed by a pause, so the kill below lands between phases
        # however loaded the machine is (what is proven is unchanged: a kill between any two
        # unlinks leaves every entry whole or absent, and a rerun finishes).
        proc = spawn("prune", url, "--keep", NEW, env={PHASE_PAUSE_ENV: "0.1"})
        assert proc.stdout is not None and proc.stdout.readline().startswith("planned")
        # Kill right after a chunk's journal appears: inside its removal phases, most of the time.
        deadline = time.monotonic() + 30
        while not (journal_dir.is_dir() and any(p.suffix == ".json" for p in journal_dir.iterdir())):
            assert time.monotonic() < deadline and proc.poll() is None, "the prune never started removing"
            time.sleep(0.0005)
        time.sleep(rng.uniform(0.01, 0.25) if trial < trials else 0.05)  # within the chunk's phases
        proc.send_signal(signal.SIGKILL)
        proc.communicate()

        report = scan(store, read_manifests=True)
        for entry in report.entries:
            # Whatever a reader sees is an entry as it was, with every file it had.
            assert entry.path in original or entry.path == keep, entry.path
            if entry.path != keep:
                assert entry.state is not EntryState.CORRUPT, (entry.path, entry.problems)
                assert set(entry.files) == original[entry.path], (entry.path, sorted(entry.files))
                if entry.manifest is not None:
                    assert check_entry(store, entry).status is CheckStatus.OK
        rerun = plan_prune([store], PrunePolicy(keep_compilers=(NEW,), current=NEW))
        # Half-removed entries read as uncommitted: the compiler rule takes those of an old
        # toolchain itself; elsewhere the journal marks them `interrupted`.
        interrupted_seen += sum(1 for i in rerun.items if i.state == "UNCOMMITTED" or i.reason is Reason.INTERRUPTED)
        result = execute_plan(rerun, [store], force=True)
        assert not result.skipped, result.skipped[:3]
        after = scan(store)
        assert [e.path for e in after.entries] == [keep]
        assert after.uncommitted == ()
        # A kill inside a write (a lease, a journal) leaves a temp file: garbage for --garbage.
        assert all(TEMP_MARKER in g.path for g in after.garbage), after.garbage
        execute_plan(plan_prune([store], PrunePolicy(garbage=True, grace=0)), [store], force=True)
        assert scan(store).garbage == ()
        assert list(store.iter_files(JOURNAL_DIR)) == []
        store.delete([f.path for f in store.iter_files(keep)])
    assert interrupted_seen, "no kill landed inside a removal: the test did not exercise the window"


@pytest.mark.slow
def _rounds(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def wait_for_rounds(paths: list[Path], at_least: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while any(_rounds(p) < at_least for p in paths):
        assert time.monotonic() < deadline, f"publishers did not reach round {at_least}: {[_rounds(p) for p in paths]}"
        time.sleep(0.02)


def test_prune_racing_publishers_loses_nothing_published_after_the_plan(fs_store: Store, tmp_path: Path) -> None:
    store = fs_store
    keys = 80
    for i in range(keys):
        publish_key(store, f"MODULE_{i}+abb26765")
    # Every entry is old by the plan's clock: all of them are selected.
    plan = plan_prune([store], PrunePolicy(older_than=0, hit_grace=0), now=time.time() + 60)
    assert plan.entries == keys
    stop = tmp_path / "stop"
    rounds = [tmp_path / f"rounds-{n}" for n in range(2)]
    publishers = [spawn("publish", store.url, "--keys", str(keys), "--stop", str(stop), "--tag", str(n),
                        "--rounds", str(rounds[n])) for n in range(2)]
    wait_for_rounds(rounds, 1)  # both are running and found every entry present
    result = execute_plan(plan, [store], workers=2, force=True)
    # Rounds that started after the prune finished: each republishes what the prune took (no
    # fixed sleep, which a loaded machine can outrun before any publish happened).
    wait_for_rounds(rounds, max(_rounds(r) for r in rounds) + 2)
    stop.touch()
    published: set[str] = set()
    for proc in publishers:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        published |= set(json.loads(out.strip().splitlines()[-1]))
    report = scan(store, read_manifests=True)
    present = {e.path.rsplit("/", 1)[-1] for e in report.entries}
    assert report.uncommitted == () and report.garbage == ()
    for entry in report.entries:
        assert entry.state is EntryState.SUCCESS and check_entry(store, entry).status is CheckStatus.OK, entry.path
    # Every publish that succeeded after the plan is still there, whole.
    assert published <= present, sorted(published - present)[:5]
    assert published, "the publishers never published: nothing was exercised"
    assert result.removed, "the prune removed nothing: nothing was exercised"
    print(f"\nremoved {len(result.removed)}, skipped {len(result.skipped)}, republished or new {len(published)}")
