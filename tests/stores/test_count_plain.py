"""The C helper's ``count_plain`` (neffcache/stores/_listdir.c) counts a shard directory only
where listing it and asking ``Grouper.count_plain`` would have counted the same entries and
bytes; everything else it declines, and the walk lists that shard as before. And the rule it
is given (``Grouper.plain_rule``) says of every child what ``count_plain`` asks of each."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neffcache.layouts.torchneuron import _holds_neffs
from neffcache.scan import summary as summary_module
from neffcache.scan.grouping import Grouper, _in_control
from neffcache.scan.report import scan
from neffcache.scan.summary import ScanSummary, summarize
from neffcache.stores import local_in_step, local_listing
from neffcache.stores.base import TEMP_MARKER
from neffcache.stores.local import LocalStore
from neffcache.stores.plain import PlainFiles
from neffcache.stores.safepath import SafeRoot
from neffcache.stores.walk import Counted, DirListing
from tests.stores.c_helper import needs_native

native = local_listing.native

NS = "trn2-lnc2/torchneuron-2.9.0"
KEYS = ["ab12" + "3" * 28, "ab12" + "4" * 28, "ab12" + "5" * 60, "ab13" + "6" * 28, "cd12" + "3" * 28,
        "ab12" + "7" * 27, "ab12" + "8" * 61, "AB12" + "9" * 28]
SUFFIXES = [".neff", ".neffcache.json", ".hlo", ".flags.json", ".neff.tmp.a1B2c3", ".txt", "", ".neff.neff",
            f"{TEMP_MARKER}x"]
# (tree, child, key, suffix, size, kind): kind is what the name is besides a plain file
_FILE = st.tuples(st.sampled_from(["neff", "hlo"]), st.sampled_from(["12", "13"]), st.sampled_from(KEYS),
                  st.sampled_from(SUFFIXES), st.sampled_from([0, 1, 7]),
                  st.sampled_from(["file"] * 12 + ["dir", "link-in", "link-out", "fifo"]))


def make_kind(path: Path, size: int, kind: str, target: Path) -> None:
    """``path`` as a file of ``size`` (sparse), a directory, a link to ``target`` (made, of
    ``size``: a link inside the root), a link out of the root or a FIFO; kept if there already."""
    if path.exists() or path.is_symlink():
        return
    if kind == "file":
        with path.open("wb") as f:
            f.truncate(size)
    elif kind == "dir":
        path.mkdir()
    elif kind == "link-in":
        target.write_bytes(b"t" * size)
        path.symlink_to(target)
    elif kind == "link-out":
        path.symlink_to("/etc/hostname")
    else:
        os.mkfifo(path)


def _make(root: Path, files: list[tuple[str, str, str, str, int, str]]) -> None:
    """Write the generated files below ``root/NS/<tree>/ab/<child>/``."""
    for tree in ("hlo", "neff"):
        (root / NS / tree / "ab").mkdir(parents=True, exist_ok=True)
    for tree, child, key, suffix, size, kind in files:
        directory = root / NS / tree / "ab" / child
        directory.mkdir(parents=True, exist_ok=True)
        make_kind(directory / (key + suffix), size, kind, root / "target")


def _python_count(root: Path, child: str) -> tuple[int, int] | None:
    """What listing ``ab/<child>`` in both trees and ``Grouper.count_plain`` decide."""
    safe = SafeRoot(str(root), str(root))
    batch: list[DirListing] = []
    for tree in ("hlo", "neff"):
        rel = f"{NS}/{tree}/ab/{child}"
        if not (root / rel).is_dir():
            continue
        fd = safe.open_dir(rel)
        try:
            subdirs, listing = local_listing._list_fd_python(safe, fd, rel)
        finally:
            os.close(fd)
        if subdirs:
            return None  # a batch below it: count_plain's caller judges the shard instead
        if listing is not None:
            batch.append(listing)
    if not batch:
        return (0, 0)  # nothing listed, nothing counted
    counted = Grouper().count_plain(batch)
    return None if counted is None else counted[1:]


def _c_count(root: Path, child: str) -> tuple[int, int] | None:
    """What the C helper decides of the same child, with the rule the summary would give it."""
    assert native is not None
    safe = SafeRoot(str(root), str(root))
    directories = [f"{NS}/{tree}/ab" for tree in ("hlo", "neff")]
    rule = Grouper().plain_rule(directories)
    assert rule is not None
    fds = tuple(safe.open_dir(d) for d in directories)
    try:
        mask = sum(1 << i for i, d in enumerate(directories) if (root / d / child).is_dir())
        entries, size, _, declined, _ = native.count_plain(
            fds, tuple(d in rule.primary_dirs for d in directories), [(child, mask)], rule.prefix, rule.suffixes,
            rule.primary, rule.key_min, rule.key_max)
    finally:
        for fd in fds:
            os.close(fd)
    return None if declined else (entries, size)


@needs_native
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_FILE, max_size=8))
def test_the_c_count_is_what_listing_and_counting_decide(files: list[tuple[str, str, str, str, int, str]]) -> None:
    root = Path(tempfile.mkdtemp(prefix="count-plain-"))
    try:
        _make(root, files)
        for child in ("12", "13"):
            counted, listed = _c_count(root, child), _python_count(root, child)
            if counted is None and listed is not None:
                # Declined though listing would count it: only a link (the listing resolves
                # those, with SafeRoot's rules) or a subdirectory (a batch below it) may do that.
                assert any(f[1] == child and f[5] in ("link-in", "dir") for f in files), child
            else:
                assert counted == listed, child
    finally:
        shutil.rmtree(root)


@needs_native
def test_each_kind_of_shard_is_counted_or_declined(tmp_path: Path) -> None:
    """The cases the property test must reach, each named."""
    key, other = KEYS[0], KEYS[1]
    plain = [("neff", "12", key, ".neff", 7, "file"), ("hlo", "12", key, ".hlo", 1, "file"),
             ("hlo", "12", key, ".flags.json", 1, "file"), ("neff", "12", other, ".neff", 1, "file"),
             ("neff", "12", other, ".neffcache.json", 1, "file")]
    declined = {
        "an empty NEFF (CORRUPT)": [("neff", "12", key, ".neff", 0, "file")],
        "an HLO without its NEFF (EMPTY)": [("neff", "12", key, ".neff", 1, "file"),
                                            ("hlo", "12", other, ".hlo", 1, "file")],
        "a manifest without its NEFF (uncommitted)": [("neff", "12", key, ".neffcache.json", 1, "file")],
        "a NEFF in the HLO tree is not the entry's NEFF": [("hlo", "12", key, ".neff", 1, "file")],
        "the runtime's temp file": [("neff", "12", key, ".neff", 1, "file"),
                                    ("neff", "12", other, ".neff.tmp.a1B2c3", 1, "file")],
        "our temp file": [("neff", "12", key, ".neff", 1, "file"), ("neff", "12", other, f"{TEMP_MARKER}x", 1, "file")],
        "an odd name": [("neff", "12", key, ".neff", 1, "file"), ("neff", "12", key, ".txt", 1, "file")],
        "a key of another shard": [("neff", "12", KEYS[4], ".neff", 1, "file")],
        "a key too short": [("neff", "12", KEYS[5], ".neff", 1, "file")],
        "a key too long": [("neff", "12", KEYS[6], ".neff", 1, "file")],
        "a subdirectory": [("neff", "12", key, ".neff", 1, "file"), ("neff", "12", other, ".neff", 1, "dir")],
        "a link to a file inside": [("neff", "12", key, ".neff", 1, "file"), ("hlo", "12", key, ".hlo", 1, "link-in")],
        "a link out of the root": [("neff", "12", key, ".neff", 1, "link-out")],
    }
    root = tmp_path / "plain"
    _make(root, plain)
    assert _c_count(root, "12") == _python_count(root, "12") == (2, 11)
    for i, (why, files) in enumerate(declined.items()):
        root = tmp_path / str(i)
        _make(root, files)
        assert _c_count(root, "12") is None, why
        if why not in ("a subdirectory", "a link to a file inside"):  # listed, then judged
            assert _python_count(root, "12") is None, why
    root = tmp_path / "fifo"  # a FIFO is a listing's problem (never opened): declined, then judged
    _make(root, [*plain, ("neff", "12", KEYS[0], ".hlo", 1, "fifo")])
    assert _c_count(root, "12") is None and _python_count(root, "12") is None
    root = tmp_path / "bytes"  # a name that is not UTF-8 is not plain
    _make(root, plain)
    os.close(os.open(os.fsencode(root / NS / "neff" / "ab" / "12") + b"/ab12\xff.neff", os.O_CREAT | os.O_WRONLY))
    assert _c_count(root, "12") is None and _python_count(root, "12") is None


def _without_seconds(summary: ScanSummary) -> ScanSummary:
    return dataclasses.replace(summary, seconds=0.0)


@needs_native
@pytest.mark.parametrize("how", ["counted in C", "listed and counted", "every entry judged", "python listing"])
def test_a_summary_with_shards_counted_in_c_is_the_full_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 how: str) -> None:
    """Plain shards, declined shards of every kind and a symlinked shard in one namespace: the
    totals, warnings and progress are the same however the shards are counted."""
    root = tmp_path / "c"
    files = []
    for i in range(256):  # every child of ab/ in both trees, most plain
        key = f"ab{i:02x}" + f"{i:028x}"
        files.append(("neff", f"{i:02x}", key, ".neff", 1 + i, "file"))
        if i % 3 == 0:
            files.append(("hlo", f"{i:02x}", key, ".hlo", 3, "file"))
    files += [("neff", "12", KEYS[0], ".neff", 0, "file"), ("hlo", "13", KEYS[3], ".neff", 1, "file"),
              ("neff", "14", "ab14" + "1" * 28, ".txt", 1, "file"), ("neff", "15", "ab15" + "1" * 28, ".x", 1, "dir"),
              ("neff", "16", "ab16" + "1" * 28, ".neff", 1, "link-out")]
    _make(root, files)
    # ab/17 is a symlinked directory in one tree: reported, not followed
    shutil.rmtree(root / NS / "hlo" / "ab" / "17", ignore_errors=True)
    (root / NS / "hlo" / "ab" / "17").symlink_to(root / NS / "neff" / "ab" / "17")
    store = LocalStore(root)
    expected = _without_seconds(ScanSummary.of_report(scan(store)))
    counted_in_c = []
    original = local_in_step.count_children
    if how == "listed and counted":
        monkeypatch.setattr(local_in_step, "count_children", lambda *args: None)
    elif how == "every entry judged":
        monkeypatch.setattr(summary_module, "COUNT_PLAIN_SHARDS", False)
    elif how == "python listing":
        monkeypatch.setattr(local_listing, "native", None)
    else:
        def watched(plan: object, listed: object, subdirs: dict[str, object]) -> Counted | None:
            before = set(subdirs)
            counted = original(plan, listed, subdirs)  # type: ignore[arg-type]
            counted_in_c.extend(before - set(subdirs))
            return counted
        monkeypatch.setattr(local_in_step, "count_children", watched)
    summary = summarize(store)
    assert _without_seconds(summary) == expected
    assert summary.entries >= 256 and summary.by_state()["CORRUPT"] >= 2 and summary.warning_count >= 2
    if how == "counted in C":
        assert len(counted_in_c) >= 240 and not {"12", "13", "14", "15", "16"} & set(counted_in_c)


@needs_native
def test_shards_counted_in_c_report_their_files_as_progress(tmp_path: Path) -> None:
    root = tmp_path / "c"
    for i in range(12_000):
        key = f"{i:032x}"[::-1]
        path = root / NS / "neff" / key[:2] / key[2:4] / f"{key}.neff"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"n")
    progress: list[int] = []
    summary = summarize(LocalStore(root), progress=progress.append)
    assert summary.entries == 12_000
    assert len(progress) >= 2 and progress == sorted(progress) and 5000 <= progress[-1] <= 12_000


_PART = st.sampled_from(["trn2-lnc2", "trn1-lnc1", "torchneuron-2.9.0", "torchneuron-x", "neff", "hlo", "ab", "12",
                         "AB", "1", "cd\n", ".neffcache", "neuronxcc-2.9.0", "MODULE_1", "neuron", "compile_cache",
                         "vllm-0.9.1"])


# Levels shaped like layout B's more often than random parts would make them.
_LEVEL = st.tuples(st.sampled_from(["", "trn2-lnc2/", "trn1-lnc1/", "bad-lnc2/", ".neffcache/"]),
                   st.sampled_from(["torchneuron-2.9.0/"] * 4 + ["torchneuron-x/", "neuronxcc-2.9.0/",
                                                                  "vllm-0.9.1/neuron/compile_cache/", ""]),
                   st.sampled_from(["neff/", "hlo/"] * 2 + ["x/", ""]),
                   st.sampled_from(["ab", "12", "ff", "00"] * 2 + ["AB", "1", "cd\n", "MODULE_1"])).map("".join)
_DIRECTORY = st.one_of(_LEVEL, st.lists(_PART, min_size=0, max_size=5).map("/".join))


@settings(max_examples=1500, deadline=None)
@given(st.one_of(st.lists(_DIRECTORY, min_size=1, max_size=2),
                 _LEVEL.map(lambda d: [d.replace("neff/", "hlo/"), d])),  # a level in both trees
       st.lists(st.sampled_from(sorted(f"{i:02x}" for i in range(256))), min_size=1, max_size=6))
def test_the_rule_says_of_every_child_what_count_plain_asks(directories: list[str], children: list[str]) -> None:
    """``Grouper.plain_rule`` answers for all children from one: for each child it covers,
    ``count_plain``'s own questions of that child's directory get the rule's answers."""
    grouper = Grouper()
    rule = grouper.plain_rule(directories)
    if rule is None:
        return
    assert isinstance(rule, PlainFiles) and rule.namespace is not None
    for child in children:
        assert child in rule.children
        for directory in directories:
            path = f"{directory}/{child}"
            entry, _, resolved = grouper._resolve(path)
            assert not _in_control(path) and entry is None and path not in grouper.entry_dirs
            assert resolved is not None, path
            lay, shard = resolved
            assert lay.name == rule.namespace.layout
            assert shard.namespace == rule.namespace and shard.suffixes == frozenset(rule.suffixes)
            assert shard.shard == rule.prefix + child
            assert _holds_neffs(shard) == (directory in rule.primary_dirs)
            assert (rule.key_min, rule.key_max) == (shard.KEY_MIN, shard.KEY_MAX)


def test_a_rule_is_given_for_shard_levels_only() -> None:
    grouper = Grouper()
    levels = [f"{NS}/hlo/ab", f"{NS}/neff/ab"]
    rule = grouper.plain_rule(levels)
    assert rule is not None and rule.prefix == "ab" and rule.primary_dirs == {f"{NS}/neff/ab"}
    assert grouper.plain_rule(["ab"]) is not None  # a bare NEFF directory: ab/cd/<key>.neff
    for not_a_level in ([f"{NS}/neff"], [f"{NS}/neff/ab/cd"], [".neffcache/ab"], [f"{NS}/neff/AB"],
                        [f"{NS}/neff/ab", f"{NS}/neff/cd"]):
        assert grouper.plain_rule(not_a_level) is None, not_a_level
