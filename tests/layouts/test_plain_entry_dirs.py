"""A walk counts neuronxcc entry directories in C (``Walker.count_children``, the rule from
``Grouper.entry_rule`` and ``NeuronxccLayout.directory_role``'s ``entries_below``) only where listing the
directory and judging its entry would give a committed SUCCESS entry of the same size with
nothing foreign; everything else is listed as before. And the rule says of every child it
covers what ``Grouper.add`` would find."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neffcache.entry import EntryState
from neffcache.layouts.flags import FLAGS_JSON, FLAGS_TXT
from neffcache.layouts.neuronxcc import DONE, HLO, HLO_OLD, KNOWN, LOG, NEFF
from neffcache.manifest import MANIFEST_NAME
from neffcache.scan import summary as summary_module
from neffcache.scan.grouping import Grouper, _in_control
from neffcache.scan.report import scan
from neffcache.scan.summary import ScanSummary, summarize
from neffcache.stores import local_listing
from neffcache.stores.base import TEMP_MARKER
from neffcache.stores.local import LocalStore
from neffcache.stores.plain import CountedTop, PlainEntryDirs, PlainFiles
from neffcache.stores.safepath import SafeRoot
from neffcache.stores.walk import Counted, DirListing
from tests.stores.c_helper import needs_native
from tests.stores.test_count_plain import make_kind

NS = "trn2-lnc2/neuronxcc-2.9.0"
NAMES = [NEFF, DONE, HLO, HLO_OLD, FLAGS_JSON, FLAGS_TXT, LOG, MANIFEST_NAME, "x.lock", "notes.txt",
         f"model.neff{TEMP_MARKER}1", "model.neff.tmp"]
# (name, size, kind)
_FILE = st.tuples(st.sampled_from(NAMES), st.sampled_from([0, 1, 9]),
                  st.sampled_from(["file"] * 10 + ["dir", "link-in", "link-out"]))
CHILDREN = ["MODULE_1+abc", "MODULE_x_y+Z9", "MODULE_", "MODULE_a b+1", "module_1+a", "MODULE_1+abc.d", "other"]


class Counter:
    """A walk's plan: the grouper's rule for entry directories (nothing held back, no shard
    rule), and what the walk counted (and each count's top)."""

    held: frozenset[str] = frozenset()

    def __init__(self, largest: int = 0) -> None:
        self.grouper = Grouper()
        self.entries = self.size = self.files = 0
        self.largest = largest
        self.tops: list[CountedTop] = []

    def in_step_group(self, directory: str) -> str | None:
        return None

    def shards_below(self, directories: Sequence[str]) -> PlainFiles | None:
        return None

    def entries_below(self, directory: str) -> PlainEntryDirs | None:
        return self.grouper.entry_rule(directory)

    def add(self, counted: Counted) -> None:
        self.entries, self.size, self.files = (self.entries + counted.entries, self.size + counted.size,
                                               self.files + counted.files)
        self.tops.append(counted.top)


def _make(entry: Path, files: list[tuple[str, int, str]]) -> None:
    entry.mkdir(parents=True, exist_ok=True)
    for name, size, kind in files:
        make_kind(entry / name, size, kind, entry.parent.parent.parent / "target")


def _walked(root: Path, largest: int = 0) -> tuple[Counter, list[str]]:
    """Walk ``root`` with the C counting: what it counted, and the directories it listed."""
    counter = Counter(largest)
    safe = SafeRoot(str(root), str(root))
    listed = []
    for item in local_listing.walk(safe, safe.open_dir(""), "", counter):
        if isinstance(item, Counted):
            counter.add(item)
        else:
            assert isinstance(item, DirListing)
            listed.append(item.directory)
    return counter, listed


def _accepted(files: list[tuple[str, int, str]], child: str) -> bool:
    """The rule, read plainly: a covered child name; only regular files, all of them KNOWN
    names; model.done and a non-empty model.neff among them."""
    kept: dict[str, tuple[int, str]] = {}
    for name, size, kind in files:
        kept.setdefault(name, (size, kind))  # _make keeps the first of a name
    return (child in CHILDREN[:2] and all(kind == "file" and name in KNOWN for name, (_, kind) in kept.items())
            and DONE in kept and NEFF in kept and kept[NEFF][0] > 0)


@needs_native
@settings(max_examples=600, deadline=None)
@given(st.lists(_FILE, max_size=7), st.sampled_from(CHILDREN))
def test_an_entry_directory_is_counted_only_as_the_plain_success_judging_finds(
        files: list[tuple[str, int, str]], child: str) -> None:
    """The C walk counts exactly what the rule accepts, and what it accepts judging makes a
    committed SUCCESS entry with nothing foreign, of the size counted."""
    root = Path(tempfile.mkdtemp(prefix="plain-entry-"))
    try:
        _make(root / NS / child, files)
        counter, listed = _walked(root)
        assert (counter.entries == 1) == _accepted(files, child), (files, child)
        if not counter.entries:
            return
        assert f"{NS}/{child}" not in listed
        report = scan(LocalStore(root))
        (entry,) = report.entries
        assert entry.state is EntryState.SUCCESS and entry.committed and not entry.extra
        assert not report.foreign and not report.garbage and not report.warnings
        assert counter.size == entry.size and counter.files == len(entry.files)
    finally:
        shutil.rmtree(root)


@needs_native
def test_each_kind_of_entry_directory_is_counted_or_listed(tmp_path: Path) -> None:
    plain = [(NEFF, 9, "file"), (DONE, 0, "file"), (HLO, 3, "file"), (FLAGS_JSON, 2, "file")]
    cases = {
        "plain": (plain, 1),
        "with its manifest (not read by a summary)": ([*plain, (MANIFEST_NAME, 5, "file")], 1),
        "without its HLO (serves, cannot be recompiled)": (plain[:2], 1),
        "an empty NEFF (CORRUPT)": ([(NEFF, 0, "file"), (DONE, 0, "file")], 0),
        "no model.done (uncommitted)": ([(NEFF, 9, "file"), (HLO, 3, "file")], 0),
        "legacy: no model.done, flags in text": ([(NEFF, 9, "file"), (FLAGS_TXT, 1, "file")], 0),
        "a compile's lock beside it": ([*plain, ("x.lock", 0, "file")], 0),
        "another tool's file": ([*plain, ("notes.txt", 1, "file")], 0),
        "our temp file": ([*plain, (f"model.neff{TEMP_MARKER}1", 1, "file")], 0),
        "a subdirectory": ([*plain, ("notes.txt", 1, "dir")], 0),
        "a link to a file inside": ([*plain[1:], (NEFF, 9, "link-in")], 0),
        "a link out of the root": ([*plain, (LOG, 1, "link-out")], 0),
        "a failure log only (FAILED)": ([(LOG, 4, "file"), (HLO, 3, "file")], 0),
    }
    for i, (why, (files, counted)) in enumerate(cases.items()):
        root = tmp_path / str(i)
        _make(root / NS / "MODULE_1+abc", files)
        counter, _ = _walked(root)
        assert counter.entries == counted, why
        summary = summarize(LocalStore(root))
        assert _without_seconds(summary) == _without_seconds(ScanSummary.of_report(scan(LocalStore(root)))), why
    for i, child in enumerate(CHILDREN[2:]):  # not a name the runtime gives an entry: listed
        root = tmp_path / f"child-{i}"
        _make(root / NS / child, plain)
        assert _walked(root)[0].entries == 0, child


# (entry number, NEFF size, an HLO's size, how it is declined): sizes from a few values, for ties
_ENTRY = st.tuples(st.integers(0, 30), st.sampled_from([1, 2, 3]), st.sampled_from([0, 1, 2]),
                   st.sampled_from([""] * 4 + ["notes.txt", "empty NEFF", "no model.done"]))


def _largest_listed(root: Path, counted: list[str], largest: int) -> CountedTop:
    """The ``largest`` entries of the directories ``counted``, each listed in Python."""
    top: CountedTop = []
    for directory in counted:
        sizes = [item.stat().st_size for item in os.scandir(root / directory)]
        top.append((directory, directory.rpartition("/")[2], sum(sizes), len(sizes)))
    return sorted(top, key=lambda item: (-item[2], item[0], item[1]))[:largest]


@needs_native
@settings(max_examples=150, deadline=None)
@given(st.lists(_ENTRY, max_size=12), st.sampled_from([0, 1, 2, 3, 100]))
def test_the_top_of_a_count_is_the_largest_entry_directories_listing_finds(
        entries: list[tuple[int, int, int, str]], largest: int) -> None:
    """Every entry directory the walk counted (not listed), listed in Python: the count's top
    is their ``largest`` by bytes, then directory, then name; a declined one, however large,
    is not in it."""
    root = Path(tempfile.mkdtemp(prefix="plain-entry-top-"))
    try:
        made = []
        for number, neff, hlo, declined in entries:
            files = [(NEFF, 0 if declined == "empty NEFF" else neff, "file"), (HLO, hlo, "file")]
            files += [] if declined == "no model.done" else [(DONE, 0, "file")]
            files += [("notes.txt", 1000, "file")] if declined == "notes.txt" else []
            _make(root / NS / f"MODULE_{number}+abc", files)
            made.append(f"{NS}/MODULE_{number}+abc")
        counter, listed = _walked(root, largest)
        counted = sorted(set(made) - set(listed))
        assert counter.entries == len(counted)
        assert counter.tops == ([_largest_listed(root, counted, largest)] if counted else [])
        assert not {item[0] for top in counter.tops for item in top} & set(listed)
        if counted and largest >= len(counted):
            assert (sum(t[2] for t in counter.tops[0]), sum(t[3] for t in counter.tops[0])) == (counter.size,
                                                                                               counter.files)
    finally:
        shutil.rmtree(root)


def _without_seconds(summary: ScanSummary) -> ScanSummary:
    return dataclasses.replace(summary, seconds=0.0)


@needs_native
@pytest.mark.parametrize("counting", [True, False], ids=["counted in C", "every entry judged"])
def test_a_summary_with_entry_directories_counted_is_the_full_reports(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       counting: bool) -> None:
    monkeypatch.setattr(summary_module, "COUNT_PLAIN_SHARDS", counting)
    root = tmp_path / "c"
    for i in range(300):
        files = [(NEFF, 1 + i, "file"), (DONE, 0, "file"), (HLO, 2, "file")]
        if i % 50 == 7:
            files = [(NEFF, 0, "file"), (DONE, 0, "file")]  # CORRUPT
        elif i % 50 == 8:
            files = [(LOG, 3, "file")]  # FAILED
        elif i % 50 == 9:
            files = [*files, ("notes.txt", 1, "file")]  # foreign
        _make(root / NS / f"MODULE_{i}+abc", files)
    (root / NS / "MODULE_link+abc").symlink_to(root / NS / "MODULE_1+abc")  # reported, not followed
    store = LocalStore(root)
    summary = summarize(store)
    assert _without_seconds(summary) == _without_seconds(ScanSummary.of_report(scan(store)))
    states = {"SUCCESS": 300 - 12, "FAILED": 6, "LOCKED": 0, "EMPTY": 0, "CORRUPT": 6 + 1}  # and the link
    assert summary.by_state() == states
    assert summary.foreign_files == 6 and summary.warning_count >= 7


_PART = st.sampled_from(["trn2-lnc2", "trn1-lnc1", "neuronxcc-2.9.0", "neuronxcc-x", "torchneuron-2.9.0", ".neffcache",
                         "neuron", "compile_cache", "vllm-0.9.1", "MODULE_1+a", "ab", "bad-lnc2"])
_CHILD = st.text(alphabet="0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_+", min_size=1, max_size=12)


@settings(max_examples=1500, deadline=None)
@given(st.one_of(st.lists(_PART, max_size=4).map("/".join),
                 st.tuples(st.sampled_from(["", "trn2-lnc2/", "trn1-lnc1/", ".neffcache/", "x/"]),
                           st.sampled_from(["neuronxcc-2.9.0", "neuronxcc-", "vllm-0.9.1/neuron/compile_cache"]))
                 .map("".join)),
       st.lists(_CHILD, min_size=1, max_size=5))
def test_the_entry_rule_says_of_every_child_what_add_asks(directory: str, tails: list[str]) -> None:
    grouper = Grouper()
    rule = grouper.entry_rule(directory)
    if rule is None:
        return
    assert rule.namespace is not None and rule.namespace.path == directory
    for tail in tails:
        path = f"{directory}/{rule.prefix}{tail}" if directory else f"{rule.prefix}{tail}"
        found = grouper._resolve(path)[0]
        assert not _in_control(path) and found is not None, path
        assert found.namespace == rule.namespace and found.namespace.layout == "neuronxcc" and found.path == path


def test_an_entry_rule_is_given_for_namespace_directories_only() -> None:
    grouper = Grouper()
    assert grouper.entry_rule(NS) is not None and grouper.entry_rule("neuronxcc-2.9.0") is not None
    for directory in ("", "trn2-lnc2", f"{NS}/MODULE_1+a", ".neffcache/neuronxcc-2.9.0", "x/neuronxcc-2.9.0",
                      "trn2-lnc2/torchneuron-2.9.0"):
        assert grouper.entry_rule(directory) is None, directory
