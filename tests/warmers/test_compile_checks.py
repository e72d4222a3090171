"""The compile pool's neuronxcc guards, in process: flags file against MODULE name, the runtime's lock."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from neffcache.entry import EntryState
from neffcache.layouts import get_layout
from neffcache.scan.report import load_entry
from neffcache.stores.local import LocalStore
from neffcache.testing.hlo import make_hlo
from neffcache.toolchain import Toolchain
from neffcache.warmers.children import Children
from neffcache.warmers.compiling import CompileJob, CompileOutcome, CompilePool
from neffcache.warmers.placement import open_placement
from tests.simulation import Sim

TC = Toolchain("2.21.33363.0+82129205", "trn2", 2)
LAYOUT = get_layout("neuronxcc")
NS = LAYOUT.namespace_for(TC)


def _empty_entry(root: Path, graph: int, flags_file: bytes, suffix: str | None = None) -> tuple[str, bytes]:
    """An EMPTY entry as a graph extraction leaves it; returns (entry path, hlo)."""
    hlo = make_hlo("llama-tiny", 128, graph, 14_000)
    graph_hash = int.from_bytes(hashlib.sha256(hlo).digest()[:8], "big")
    key = f"MODULE_{graph_hash}+{suffix or hashlib.md5(flags_file).hexdigest()[:8]}"
    entry = root / NS.path / key
    entry.mkdir(parents=True)
    (entry / "model.hlo_module.pb").write_bytes(hlo)
    (entry / "compile_flags.json").write_bytes(flags_file)
    return f"{NS.path}/{key}", hlo


def _run(sim: Sim, root: Path, paths: list[str], patience: float = 3600.0) -> list[CompileOutcome]:
    placement = open_placement([str(root)], index_url=None, token=None, spool_root=root.parent / "spool")
    try:
        store = placement.work
        jobs = [CompileJob("b", NS, p.rsplit("/", 1)[1], store, f"{p}/model.hlo_module.pb",
                           ("--model-type=transformer",), TC) for p in paths]
        outcomes: list[CompileOutcome] = CompilePool(placement, sim.bin_dir / "neuronx-cc", Children(),
                                                     runtime_lock_patience=patience).run(jobs)
        return outcomes
    finally:
        placement.close()


@pytest.fixture(autouse=True)
def _path(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{sim.bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("TMPDIR", sim.env["TMPDIR"])


def test_an_entry_whose_flags_file_does_not_match_its_name_is_refused(sim: Sim, tmp_path: Path) -> None:
    root = tmp_path / "store"
    good, _ = _empty_entry(root, 0, json.dumps(["--target=trn2", "--model-type=transformer"]).encode())
    bad, _ = _empty_entry(root, 1, json.dumps(["--target=trn2", "-O3"]).encode(),
                          suffix=hashlib.md5(b'["--target=trn2", "--model-type=transformer"]').hexdigest()[:8])
    outcomes = {o.job.path: o for o in _run(sim, root, [good, bad])}
    assert outcomes[good].status == "compiled"
    assert outcomes[bad].status == "refused" and "does not match the MODULE name" in outcomes[bad].reason
    assert len(sim.compiles()) == 1
    store = LocalStore(root)
    entry = load_entry(store, good)
    assert entry is not None and entry.state is EntryState.SUCCESS and not LAYOUT.locks_of(entry)
    # The flags file written is the 2.21 runtime's: the name is the one that runtime computes.
    assert (root / good / "compile_flags.json").read_bytes() == b'["--target=trn2", "--model-type=transformer"]'
    bad_entry = load_entry(store, bad)
    assert bad_entry is not None and bad_entry.state is EntryState.EMPTY


def test_a_runtime_lock_is_waited_on_then_reported_not_compiled(sim: Sim, tmp_path: Path) -> None:
    root = tmp_path / "store"
    path, _ = _empty_entry(root, 0, json.dumps(["--target=trn2", "--model-type=transformer"]).encode())
    lock = root / path / "model.hlo_module.pb.lock"
    lock.touch()  # a runtime compiles it (or died doing so)
    started = time.monotonic()
    [outcome] = _run(sim, root, [path], patience=0.5)
    assert time.monotonic() - started >= 0.5  # it waited as the runtime would
    assert outcome.status == "failed" and "not compiled twice" in outcome.reason
    assert sim.compiles() == [] and lock.exists()  # the runtime's lock is not ours to remove


def test_the_runtime_lock_is_released_after_a_failed_compile(sim: Sim, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEFFSIM_FAIL_MATCH", "g0$")
    root = tmp_path / "store"
    path, _ = _empty_entry(root, 0, json.dumps(["--target=trn2", "--model-type=transformer"]).encode())
    [outcome] = _run(sim, root, [path])
    assert outcome.status == "failed"
    assert not (root / path / "model.hlo_module.pb.lock").exists()
    entry = load_entry(LocalStore(root), path)
    assert entry is not None and entry.state is EntryState.FAILED
