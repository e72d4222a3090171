"""Layout B read as TorchNeuron's native backend writes it: 32-hex keys, temp files, op-key lines."""

from __future__ import annotations

import os
import time
from pathlib import Path

from neffcache.entry import EntryState
from neffcache.layouts import LogLine, get_layout
from neffcache.operations.scan import scan
from neffcache.prune import PrunePolicy, execute_plan, plan_prune
from neffcache.stores.local import LocalStore
from neffcache.toolchain import Toolchain
from tests.runtime_caches import VERSION, all_files, native_key, write_native_neff, write_native_temp

OPS = ["aten::add_t0_(3, 3)_float32", "aten::mm_t0_(128, 64)_bf16", "aten::relu_t1_(8,)_float32"]
TC = Toolchain(VERSION, "trn2", 2)


def _age(root: Path, seconds: float) -> None:
    old = time.time() - seconds
    for p in root.rglob("*"):
        os.utime(p, (old, old))


def test_bare_native_dir_scans_every_32_hex_entry(tmp_path: Path) -> None:
    neffs = tmp_path / "neff_cache"
    for op in OPS:
        write_native_neff(neffs, op)
    temp = write_native_temp(neffs, "aten::sub_t0_(3, 3)_float32")
    report = scan(LocalStore(neffs))
    assert {e.key for e in report.entries} == {native_key(op) for op in OPS}
    assert all(e.layout == "torchneuron" and e.state is EntryState.SUCCESS for e in report.entries)
    assert all(e.namespace.path == "" for e in report.entries)
    # The runtime's write in flight is neither an entry nor neffcache's garbage.
    assert report.garbage == () and report.uncommitted == ()
    layout = get_layout("torchneuron")
    rel = str(temp.relative_to(neffs))
    assert layout.is_runtime_file(rel) and layout.runtime_debris_after(rel) == 24 * 3600.0
    assert not layout.is_runtime_file(rel.replace(".tmp.a1B2c3", ".tmp.a1"))


def test_prune_garbage_keeps_native_neffs_inside_a_namespace(tmp_path: Path) -> None:
    """The runtime pointed at neffcache's namespace (``neffcache env``) writes 32-hex NEFFs
    there: they are entries, not orphan files, and --garbage --grace 0 removes none of them."""
    root = tmp_path / "store"
    neffs = root / f"trn2-lnc2/torchneuron-{VERSION}/neff"
    for op in OPS:
        write_native_neff(neffs, op)
    write_native_temp(neffs, "aten::sub_t0_(3, 3)_float32")
    _age(root, 3 * 86400)
    before = all_files(root)
    store = LocalStore(root)
    report = scan(store)
    assert len(report.entries) == 3 and report.garbage == ()
    assert {e.namespace.toolchain for e in report.entries} == {TC}
    plan = plan_prune([store], PrunePolicy(garbage=True, grace=0))
    assert not plan.items
    execute_plan(plan, [store])
    assert all_files(root) == before


def test_64_hex_keys_of_neffcaches_own_api_still_read(tmp_path: Path) -> None:
    key = "ab" + "cd" + "0" * 60
    path = tmp_path / "n" / "ab" / "cd" / f"{key}.neff"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"NEFF")
    (entry,) = scan(LocalStore(tmp_path / "n")).entries
    assert entry.key == key
    for bad in ("ab/cd/" + "abcd" + "0" * 27 + ".neff", "ab/cd/" + "abcd" + "0" * 61 + ".neff",
                "ab/ce/" + "abcd" + "0" * 28 + ".neff"):
        assert get_layout("torchneuron").locate(bad) is None


def test_native_log_lines_carry_readable_op_keys() -> None:
    layout = get_layout("torchneuron")
    op = "aten::add_t0_(3, 3)_float32_trn2_2"
    assert layout.parse_log_line(f"[NEFF_CACHE] Cache HIT for key: {op}\n") == LogLine("hit", key=op)
    assert layout.parse_log_line(f"2026-01-01 INFO [NEFF_CACHE] Cache MISS for key: {op}") == LogLine("miss", key=op)
    assert layout.parse_log_line(f"[NEFF_CACHE] Storing NEFF for key: {op}") == LogLine("success", key=op)
    # No failure line of this form exists: a failed compile is a Python exception.
    assert layout.parse_log_line(f"[NEFF_CACHE] Compilation FAILED for key: {op}") is None
    assert layout.parse_log_line("Using a cached neff at /x/model.neff") is None


def test_env_notes_say_where_locks_live_and_that_the_directory_is_versioned() -> None:
    layout = get_layout("torchneuron")
    notes = " ".join(layout.env_notes("/mnt/fsx", layout.namespace_for(TC)))
    assert "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR/locks/<key>.lock" in notes and "/tmp/local_cache" in notes
    assert "1200" in notes and f"torchneuron-{VERSION}" in notes and "no compiler version" in notes


def test_temp_files_inside_a_managed_namespace_are_the_runtimes() -> None:
    layout = get_layout("torchneuron")
    key = native_key(OPS[0])
    managed = f"trn2-lnc2/torchneuron-{VERSION}/neff/{key[:2]}/{key[2:4]}/{key}.neff.tmp.Zx81Qa"
    assert layout.is_runtime_file(managed) and layout.locate(managed) is None
    assert not layout.is_runtime_file(f"trn2-lnc2/torchneuron-{VERSION}/hlo/{key[:2]}/{key[2:4]}/{key}.neff.tmp.Zx81Qa")


def test_a_shard_directory_places_every_name_as_locate_does() -> None:
    """A scan resolves a shard directory once and takes only keys from names (shard_dir); every
    name it accepts must be placed exactly as locate() of the whole path places it, and every
    other name is left to locate(): foreign and odd names are reported as they always were."""
    layout = get_layout("torchneuron")
    key = "ab12" + "3" * 28
    names = [f"{key}{suffix}" for suffix in (".neff", ".neffcache.json", ".hlo", ".flags.json")]
    odd = [f"{key}.neff\n", f"{key}.NEFF", f"{key}.txt", f"{key}.neff.tmp.a1B2c3", f"{key[:-1]}.neff",
           f"{key}{'0' * 33}.neff", f"{key.upper()}.neff", f"cd{key[2:]}.neff", f"{key}", f"x{key}.neff",
           f"{key}..neff", f"{key}.neff.neff", f"{key}-1.neff", ".neff"]
    namespaces: dict = {}
    for directory in ("trn2-lnc2/torchneuron-2.9.0/neff/ab/12", "torchneuron-2.9.0/hlo/ab/12", "ab/12"):
        shard_dir = layout.shard_dir(directory, namespaces)
        assert shard_dir is not None
        for name in names + odd:
            located = layout.locate(f"{directory}/{name}")
            got = shard_dir.key_of(name)
            if got is None:
                continue  # the scan asks locate() of the whole path: the same answer by definition
            assert located is not None, name
            assert (located.key, located.path, located.base, located.name, located.namespace) == (
                got, shard_dir.entry_dir + got, shard_dir.base, shard_dir.name_dir + name, shard_dir.namespace)
        assert all(shard_dir.key_of(n) is None for n in odd)
    for directory in ("trn2-lnc2/torchneuron-2.9.0/neff/ab/12\n", "torchneuron-2.9.0/neff/ab", "ab/12/cd",
                      "trn2-lnc2/neuronxcc-2.9.0/MODULE_1", "torchneuron-2.9.0/other/ab/12", "AB/12"):
        assert layout.shard_dir(directory, namespaces) is None, directory
