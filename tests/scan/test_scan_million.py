"""A million entries: what a scan counts is what ``find`` lists in the same tree (issue 17).

The tree (bench/scan_tree.py, the scan benchmark's own builder): 980,000 layout-B entries
(TorchNeuron's native cache: a NEFF each, an HLO for one in 4), 20,000 layout-A entries
(libneuronxla's: four files in a directory each), and 1,000 of each kind of file a scan must
tell apart from an entry: neffcache's temp files and a layout-B manifest whose NEFF was never
written (garbage), the runtime's in-flight ``<shard>/.tmp.XXXXXX`` (neither entry nor
garbage: the runtime's own), other tools' files in a shard, in an entry, nested below one and in optimum's
registry (foreign). Files are sparse: realistic sizes, no data block.

The expected figures come from ``find -printf '%P %s'`` read with the file names the runtimes
use (docs/runtimes.md), not from the builder and not from the library: entries are the NEFFs
of layout B and the ``model.done`` of layout A, an entry's size the sum of its files' sizes.
Both the library's ``scan`` and the CLI's ``neffcache scan --json`` (its own process) must
report exactly those counts and sizes, in total and per namespace.

Slow (3.5 minutes of CPU with the scan of 2026-12; 18 minutes on 2 cores at load 12-15): it
runs in CI (``.ci/run`` sets NEFFCACHE_REQUIRE_SERVICES=1; CI services set CI=true), and elsewhere only with
NEFFCACHE_SLOW=1. The tree goes to /dev/shm when that is a tmpfs with room for its inodes
(sparse files take no memory there beyond their inodes): a million files are made and removed
there several times faster than on a shared disk. Otherwise it goes to ``tmp_path``. Either
way it is deleted at the end: pytest keeps the last three base temp directories, which would
otherwise keep millions of inodes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.scan_tree import LAYOUT_A_NS, LAYOUT_B_NS, add_debris, build_layout_a, build_layout_b
from neffcache.scan.report import ScanReport, scan
from neffcache.scan.summary import ScanSummary, summarize
from neffcache.stores.local import LocalStore

A_ENTRIES = 20_000
B_ENTRIES = 980_000
DEBRIS = 1_000  # of each of the eight kinds add_debris makes
INODES = 1_600_000  # files and directories (about 1.46M), with room to spare
SLOW_ENV = "NEFFCACHE_SLOW"


def _slow_tests_run() -> bool:
    # Read at import: the autouse fixture (tests/conftest.py) clears NEFFCACHE_* before a test runs.
    return (os.environ.get(SLOW_ENV) == "1" or os.environ.get("CI") == "true"
            or os.environ.get("NEFFCACHE_REQUIRE_SERVICES") == "1")


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _slow_tests_run(), reason=(
        f"a million-entry scan takes minutes; run it with {SLOW_ENV}=1 (CI runs it: .ci/run sets "
        "NEFFCACHE_REQUIRE_SERVICES=1)")),
]

# The runtimes' file names (docs/runtimes.md), written out here rather than taken from the layouts.
_HEX_KEY = r"(?P<a>[0-9a-f]{2})/(?P<b>[0-9a-f]{2})/(?P<key>(?P=a)(?P=b)[0-9a-f]{28,60})"
_B_FILE = re.compile(r"^(?P<ns>(?:[a-z0-9]+-lnc[12]/)?torchneuron-[^/]+)/(?P<dir>neff|hlo)/" + _HEX_KEY
                     + r"(?P<suffix>\.neff|\.hlo|\.neffcache\.json|\.flags\.json)$")
_A_FILE = re.compile(r"^(?P<ns>(?:[a-z0-9]+-lnc[12]/)?neuronxcc-[^/]+)/(?P<module>MODULE_[^/]+)/"
                     r"(?P<name>model\.hlo_module\.pb|compile_flags\.json|model\.neff|model\.done)$")
_B_TEMP = re.compile(r"^(?:[a-z0-9]+-lnc[12]/)?torchneuron-[^/]+/neff/[0-9a-f]{2}/[0-9a-f]{2}/"
                     r"\.tmp\.[A-Za-z0-9_]{6}$")
_ENTRY_FILES = {("neff", ".neff"), ("neff", ".neffcache.json"), ("hlo", ".hlo"), ("hlo", ".flags.json")}


@dataclass
class Totals:
    """What a scan reports, as ``find`` sees it: entries and their size by namespace, garbage, foreign."""

    namespaces: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (entries, size)
    garbage_files: int = 0
    uncommitted: int = 0
    garbage_size: int = 0
    foreign_files: int = 0
    foreign_size: int = 0
    runtime_files: int = 0  # the runtime's own writes in flight: neither entry nor garbage

    @property
    def entries(self) -> int:
        return sum(n for n, _ in self.namespaces.values())

    @property
    def size(self) -> int:
        return sum(s for _, s in self.namespaces.values())


def counted_by_find(root: Path) -> Totals:
    listing = subprocess.run(["find", str(root), "-type", "f", "-printf", "%P\\t%s\\n"],
                             capture_output=True, text=True, check=True).stdout
    keys: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)  # (ns, key) -> suffix -> size
    modules: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)  # (ns, MODULE_..) -> name -> size
    out = Totals()
    for line in listing.splitlines():
        path, _, size_text = line.rpartition("\t")
        size = int(size_text)
        if ".neffcache-tmp-" in path.rpartition("/")[2]:
            out.garbage_files += 1
            out.garbage_size += size
        elif _B_TEMP.match(path):
            out.runtime_files += 1
        elif (b := _B_FILE.match(path)) and (b["dir"], b["suffix"]) in _ENTRY_FILES:
            keys[b["ns"], b["key"]][b["suffix"]] = size
        elif a := _A_FILE.match(path):
            modules[a["ns"], a["module"]][a["name"]] = size
        else:
            out.foreign_files += 1
            out.foreign_size += size
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for (ns, _), files in keys.items():
        if ".neff" in files:
            counts[ns] += 1
            sizes[ns] += sum(files.values())
        else:
            # This tree has no HLO without its NEFF (that would be an EMPTY entry): only
            # manifests whose NEFF was never written, uncommitted writes.
            assert ".neffcache.json" in files, files
            out.uncommitted += 1
            out.garbage_size += sum(files.values())
    for (ns, _), files in modules.items():
        assert "model.done" in files and "model.neff" in files, files  # committed, every one
        counts[ns] += 1
        sizes[ns] += sum(files.values())
    out.namespaces = {ns: (counts[ns], sizes[ns]) for ns in counts}
    return out


def reported_by_scan(report: ScanReport) -> Totals:
    assert report.by_state()["SUCCESS"] == len(report.entries), report.by_state()
    return Totals({s.namespace.path: (s.entries, s.size) for s in report.namespaces()}, len(report.garbage),
                  len(report.uncommitted), report.garbage_size, len(report.foreign), report.foreign_size,
                  len(report.runtime_temp))


def reported_by_cli(data: dict[str, object]) -> Totals:
    garbage, foreign, runtime = data["garbage"], data["foreign"], data["runtime_temp"]
    assert isinstance(garbage, dict) and isinstance(foreign, dict) and isinstance(runtime, dict)
    assert isinstance(data["namespaces"], list)
    states = data["states"]
    assert isinstance(states, dict) and states["SUCCESS"] == data["entries"] == sum(states.values()), states
    totals = Totals({ns["path"]: (ns["entries"], ns["size"]) for ns in data["namespaces"]}, garbage["files"],
                    garbage["uncommitted_entries"], garbage["size"], foreign["files"], foreign["size"],
                    runtime["files"])
    assert (totals.entries, totals.size) == (data["entries"], data["size"])
    return totals


def _on_tmpfs(path: Path) -> bool:
    with open("/proc/mounts") as mounts:
        return any(line.split()[1:3] == [str(path), "tmpfs"] for line in mounts)


def tree_base(tmp_path: Path) -> Path:
    shm = Path("/dev/shm")
    if (shm.is_dir() and os.access(shm, os.W_OK) and _on_tmpfs(shm)
            and os.statvfs(shm).f_favail > INODES):
        return Path(tempfile.mkdtemp(prefix="neffcache-scan-million-", dir=shm))
    return tmp_path / "tree"


@pytest.mark.timeout(1800)
def test_a_million_entries_scan_as_find_lists_them(tmp_path: Path) -> None:
    base = tree_base(tmp_path)
    root = base / "cache"
    try:
        build_layout_b(root, B_ENTRIES)
        build_layout_a(root, A_ENTRIES)
        add_debris(root, DEBRIS, a_entries=A_ENTRIES, b_entries=B_ENTRIES)
        expected = counted_by_find(root)
        # The tree is what this test says it is (else the comparisons below prove less).
        assert expected.namespaces.keys() == {LAYOUT_A_NS, LAYOUT_B_NS}
        assert (expected.entries, expected.uncommitted) == (A_ENTRIES + B_ENTRIES, DEBRIS)
        assert (expected.garbage_files, expected.foreign_files, expected.runtime_files) == (2 * DEBRIS, 4 * DEBRIS,
                                                                                           DEBRIS)

        report = scan(LocalStore(root, read_only=True))
        assert report.warnings == ()
        assert reported_by_scan(report) == expected
        # The plain scan's streaming totals (layout B's two trees listed in step) are the report's.
        summary = summarize(LocalStore(root, read_only=True))
        assert dataclasses.replace(summary, seconds=0.0) == dataclasses.replace(ScanSummary.of_report(report),
                                                                               seconds=0.0)
        del report  # a million entries: freed before the CLI's process needs as much again

        cli = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "scan", str(root), "--json"],
                             capture_output=True, text=True, check=False)
        assert cli.returncode == 0, cli.stderr[-2000:]
        assert reported_by_cli(json.loads(cli.stdout)) == expected
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=True)
