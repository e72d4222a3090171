"""The torchneuron layout read as TorchNeuron's two writers leave it: the C++ writer's 32-hex
sharded NEFFs and the kernel path's ``<K>/<K>.neff``, each writer's temp files, op-key lines."""

from __future__ import annotations

import os
import time
from pathlib import Path

from neffcache.entry import EntryState
from neffcache.layouts import LogLine, get_layout
from neffcache.prune import PrunePolicy, execute_plan, plan_prune
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from neffcache.toolchain import Toolchain
from tests.runtime_caches import (
    VERSION,
    all_files,
    kernel_key,
    native_key,
    write_kernel_neff,
    write_kernel_temp,
    write_native_neff,
    write_native_temp,
)

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
    assert report.runtime_temp and report.runtime_temp[0].path == rel and report.foreign == ()
    assert not layout.is_runtime_file(rel.replace(".tmp.a1B2c3", ".tmp.a1"))


def test_prune_garbage_keeps_native_neffs_and_young_temp_files_inside_a_namespace(tmp_path: Path) -> None:
    """The runtime pointed at neffcache's namespace (``neffcache env``) writes its NEFFs there:
    they are entries, not orphan files, and --garbage --grace 0 removes none of them. A temp
    file of either writer is a write in flight for a day (its lock is on another host's disk,
    so nothing here can tell it from a dead one): kept; a dead writer's after that is garbage."""
    root = tmp_path / "store"
    neffs = root / f"trn2-lnc2/torchneuron-{VERSION}/neff"
    for op in OPS:
        write_native_neff(neffs, op)
    write_kernel_neff(neffs, "kernel-0")
    old_temp = write_native_temp(neffs, "aten::sub_t0_(3, 3)_float32")
    _age(root, 3 * 86400)
    write_kernel_temp(neffs, "kernel-1")  # in flight now
    young = write_native_temp(neffs, OPS[0])
    os.utime(young, (time.time() - 20 * 3600, time.time() - 20 * 3600))  # 20 hours: still maybe alive
    store = LocalStore(root)
    report = scan(store)
    assert len(report.entries) == 4 and report.garbage == () and len(report.runtime_temp) == 3
    assert {e.namespace.toolchain for e in report.entries} == {TC}
    plan = plan_prune([store], PrunePolicy(garbage=True, grace=0))
    assert [item.path for item in plan.items] == [str(old_temp.relative_to(root))]
    assert "its writer is gone" in plan.items[0].detail
    removed = str(old_temp.relative_to(root))
    before = {p: b for p, b in all_files(root).items() if p != removed}
    execute_plan(plan, [store])
    assert {p: b for p, b in all_files(root).items() if not p.startswith(".neffcache/")} == before
    assert len(scan(store).entries) == 4


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
    # HIT and MISS come from an in-process dictionary consulted before the disk cache: a MISS may
    # be a disk hit, a HIT is a graph the process had already. Neither is a cache hit or miss.
    assert layout.parse_log_line(f"[NEFF_CACHE] Cache HIT for key: {op}\n") == LogLine("reuse", key=op)
    assert layout.parse_log_line(f"2026-01-01 INFO [NEFF_CACHE] Cache MISS for key: {op}") == LogLine("lookup", key=op)
    assert layout.parse_log_line(f"[NEFF_CACHE] Storing NEFF for key: {op}") == LogLine("stored", key=op)
    assert layout.counts_from_cache
    # No failure line of this form exists: a failed compile is a Python exception.
    assert layout.parse_log_line(f"[NEFF_CACHE] Compilation FAILED for key: {op}") is None
    assert layout.parse_log_line("Using a cached neff at /x/model.neff") is None


def test_env_notes_say_where_locks_live_and_that_the_directory_is_versioned() -> None:
    layout = get_layout("torchneuron")
    notes = " ".join(layout.env_notes("/mnt/fsx", layout.namespace_for(TC)))
    assert "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR/locks/<key>.lock" in notes and "/tmp/local_cache" in notes
    assert "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR/<key>/locks/compile.lock" in notes
    assert "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT" in notes and "1200" in notes
    assert f"torchneuron-{VERSION}" in notes and "no compiler version" in notes
    assert "NEURON_CC_FLAGS and NEURON_COMPILER_OPT_LEVEL are part of every key" in notes


def test_temp_files_inside_a_managed_namespace_are_the_runtimes() -> None:
    layout = get_layout("torchneuron")
    key, kernel = native_key(OPS[0]), kernel_key(OPS[0])
    ns = f"trn2-lnc2/torchneuron-{VERSION}"
    for temp in (f"{ns}/neff/{key[:2]}/{key[2:4]}/.tmp.Zx81Qa", f"{ns}/neff/{kernel}/tmpab_cd12x.tmp",
                 f"{key[:2]}/{key[2:4]}/.tmp.Zx81Qa", f"{kernel}/tmp0a1b2c3d.tmp"):
        assert layout.is_runtime_file(temp) and layout.locate(temp) is None, temp
    for other in (f"{ns}/hlo/{key[:2]}/{key[2:4]}/.tmp.Zx81Qa",  # not a NEFF tree
                  f"{ns}/neff/{key[:2]}/{key[2:4]}/{key}.neff.tmp.Zx81Qa",  # no writer's name
                  f"{ns}/neff/{key[:2]}/{key[2:4]}/.tmp.Zx81",  # not mkstemp's six characters
                  f"{ns}/neff/{kernel[:63]}/tmpab_cd12x.tmp", f"{ns}/neff/{kernel}/tmpab_cd12x.tmp\n",
                  "tmpab_cd12x.tmp", f"{ns}/neff/tmpab_cd12x.tmp"):  # only inside a kernel's directory
        assert not layout.is_runtime_file(other), other


def test_both_writers_share_one_directory_and_every_neff_is_an_entry(tmp_path: Path) -> None:
    """The C++ writer's ``ab/cd/<32 hex>.neff`` and the kernel path's ``<K>/<K>.neff`` in one
    TORCH_NEURONX_NEFF_CACHE_DIR, in a managed namespace and as a bare directory: every NEFF is
    an entry, each writer's temp files are the runtime's (not foreign, not garbage), and a
    kernel entry's key says where its NEFF lies (``<K>/<K>``), apart from neffcache's own
    64-hex sharded keys."""
    layout = get_layout("torchneuron")
    for neffs, ns_path in ((tmp_path / "managed" / f"trn2-lnc2/torchneuron-{VERSION}" / "neff",
                            f"trn2-lnc2/torchneuron-{VERSION}"), (tmp_path / "bare", "")):
        cpp = [write_native_neff(neffs, op) for op in OPS]
        kernels = [write_kernel_neff(neffs, f"kernel-{i}") for i in range(4)]
        write_native_temp(neffs, "aten::sub_t0_(3, 3)_float32")
        write_kernel_temp(neffs, "kernel-0")
        root = tmp_path / "managed" if ns_path else neffs
        report = scan(LocalStore(root))
        assert len(report.entries) == len(cpp) + len(kernels) == 7
        assert all(e.state is EntryState.SUCCESS and e.namespace.path == ns_path for e in report.entries)
        assert {e.key for e in report.entries} == {native_key(op) for op in OPS} | {
            f"{kernel_key(f'kernel-{i}')}/{kernel_key(f'kernel-{i}')}" for i in range(4)}
        assert report.foreign == () and report.garbage == () and len(report.runtime_temp) == 2
        for entry in report.entries:
            assert layout.locate_entry(entry.path) is not None
            assert layout.plan_entry(entry.namespace, entry.key).path == entry.path
            assert layout.neff_of(entry) is not None and layout.claims_key(entry.key)
            assert (layout.names(entry.namespace, entry.key).hlo is None) == ("/" in entry.key)
        from neffcache.scan.summary import summarize
        totals = summarize(LocalStore(root))
        assert sum(ns.entries for ns in totals.namespaces) == 7


def test_a_kernel_key_never_names_a_sharded_entry() -> None:
    layout = get_layout("torchneuron")
    k = kernel_key("x")
    assert layout.claims_key(f"{k}/{k}") and layout.claims_key(k)  # the latter: neffcache's own API key
    for bad in (f"{k}/{kernel_key('y')}", f"{k[:63]}/{k[:63]}", f"{k.upper()}/{k.upper()}", f"{k}/{k}/{k}"):
        assert not layout.claims_key(bad), bad
    ns = layout.namespace_for(TC)
    assert layout.plan_entry(ns, f"{k}/{k}").path == f"{ns.path}/neff/{k}/{k}"
    assert layout.plan_entry(ns, k).path == f"{ns.path}/neff/{k[:2]}/{k[2:4]}/{k}"
    for path in (f"{ns.path}/neff/{k}/{kernel_key('y')}.neff", f"{ns.path}/hlo/{k}/{k}.neff",
                 f"{ns.path}/neff/{k}/{k}.hlo", f"{k}/{k}.flags.json", f"{k}/{k}.neff\n"):
        assert layout.locate(path) is None, path


def test_env_problems_name_what_turns_torchneurons_cache_off() -> None:
    layout = get_layout("torchneuron")
    problems = layout.env_problems({"TORCH_NEURONX_NEFF_DISABLE_CACHE": "1",
                                    "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT": "nan",
                                    "TORCH_NEURONX_NEFF_CACHE_DIR": "/mnt/fsx/c/neff",
                                    "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR": "/mnt/fsx/c/neff/locks"})
    assert [p.variable for p in problems] == ["TORCH_NEURONX_NEFF_DISABLE_CACHE",
                                              "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT",
                                              "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"]
    assert layout.env_problems({"TORCH_NEURONX_NEFF_DISABLE_CACHE": "0",
                                "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT": "600"}) == []


def test_a_shard_directory_places_every_name_as_locate_does() -> None:
    """A scan resolves a shard directory once and takes only keys from names (its role's shard); every
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
        role = layout.directory_role(directory, namespaces)
        found = None if role is None else role.shard
        assert found is not None
        for name in names + odd:
            located = layout.locate(f"{directory}/{name}")
            got = found.key_of(name)
            if got is None:
                continue  # the scan asks locate() of the whole path: the same answer by definition
            assert located is not None, name
            assert (located.key, located.path, located.base, located.name, located.namespace) == (
                got, found.entry_dir + got, found.base, found.name_dir + name, found.namespace)
        assert all(found.key_of(n) is None for n in odd)
    for directory in ("trn2-lnc2/torchneuron-2.9.0/neff/ab/12\n", "torchneuron-2.9.0/neff/ab", "ab/12/cd",
                      "trn2-lnc2/neuronxcc-2.9.0/MODULE_1", "torchneuron-2.9.0/other/ab/12", "AB/12"):
        role = layout.directory_role(directory, namespaces)
        assert role is None or role.shard is None, directory
