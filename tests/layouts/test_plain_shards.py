"""A summary counts torchneuron shards of plain SUCCESS entries without building them
(``Layout.plain_entries``, ``Grouper.count_plain``): it may only say yes where judging every
entry would say SUCCESS, committed, nothing foreign, with the same sizes; and the namespace
cache behind the layout's directory roles answers as the regexes do."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from neffcache.entry import EntryState, FileInfo
from neffcache.layouts import get_layout
from neffcache.scan.grouping import Grouper, judge
from neffcache.stores.walk import DirListing

LAYOUT = get_layout("torchneuron")
NS = "trn2-lnc2/torchneuron-2.9.0"
SHARD = "ab/12"
KEYS = ["ab12" + "3" * 28, "ab12" + "4" * 28, "ab12" + "5" * 60, "cd12" + "3" * 28]
SUFFIXES = [".neff", ".neffcache.json", ".hlo", ".flags.json", ".neff.tmp.a1B2c3", ".txt", ""]
_FILE = st.tuples(st.sampled_from(["neff", "hlo"]), st.sampled_from(KEYS), st.sampled_from(SUFFIXES),
                  st.sampled_from([0, 1, 7]))


def _batch(files: list[tuple[str, str, str, int]]) -> list[DirListing]:
    by_tree: dict[str, dict[str, int]] = {"hlo": {}, "neff": {}}
    for tree, key, suffix, size in files:
        by_tree[tree][key + suffix] = size
    batch = []
    for tree, named in by_tree.items():
        directory = f"{NS}/{tree}/{SHARD}"
        if named:
            names = sorted(named)
            batch.append(DirListing(directory, names, [FileInfo(f"{directory}/{n}", named[n], 1.0) for n in names]))
    return batch


@settings(max_examples=1500, deadline=None)
@given(st.lists(_FILE, max_size=8))
def test_a_counted_shard_is_what_judging_each_entry_finds(files: list[tuple[str, str, str, int]]) -> None:
    batch = _batch(files)
    counted = Grouper().count_plain(batch)
    judged = Grouper()
    for listing in batch:
        judged.add(listing)
    entries = [judge(group) for group in judged.groups.values()]
    if counted is None:
        return  # declined: the summary judges every entry, which is what this compares with
    namespace, n, size = counted
    assert judged.garbage == [] and judged.unclaimed == []
    assert n == len(entries) >= 1
    for entry, foreign in entries:
        assert entry is not None and foreign == []
        assert entry.state is EntryState.SUCCESS and entry.committed and entry.problems == ()
        assert entry.namespace == namespace
    assert size == sum(entry.size for entry, _ in entries if entry is not None)


def test_plain_shards_are_counted_and_every_other_kind_declined() -> None:
    """The cases the property test must reach, each named: counted ones and declined ones."""
    key, other = KEYS[0], KEYS[1]
    plain = [("neff", key, ".neff", 7), ("hlo", key, ".hlo", 1), ("hlo", key, ".flags.json", 1),
             ("neff", other, ".neff", 1), ("neff", other, ".neffcache.json", 1)]
    counted = Grouper().count_plain(_batch(plain))
    assert counted is not None and counted[1:] == (2, 11)
    declined = {
        "an empty NEFF (CORRUPT)": [("neff", key, ".neff", 0)],
        "an HLO without its NEFF (EMPTY)": [("neff", key, ".neff", 1), ("hlo", other, ".hlo", 1)],
        "a manifest without its NEFF (uncommitted)": [("neff", key, ".neffcache.json", 1)],
        "a NEFF in the HLO tree is not the entry's NEFF": [("hlo", key, ".neff", 1)],
        "a temp file": [("neff", key, ".neff", 1), ("neff", other, ".neff.tmp.a1B2c3", 1)],
        "an odd name": [("neff", key, ".neff", 1), ("neff", key, ".txt", 1)],
        "a key of another shard": [("neff", KEYS[3], ".neff", 1)],
    }
    for why, files in declined.items():
        assert Grouper().count_plain(_batch(files)) is None, why
    with_problem = _batch(plain)
    with_problem[0] = DirListing(*with_problem[0][:3], (("x", "a symlinked directory (not followed)"),))
    assert Grouper().count_plain(with_problem) is None


_PART = st.sampled_from(["trn2-lnc2", "trn1-lnc1", "torchneuron-2.9.0", "torchneuron-x", "neff", "hlo", "ab",
                         "12", "AB", "1", "123", "cd\n", "zz", "neuronxcc-2.9.0", "MODULE_1"])


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.lists(_PART, min_size=1, max_size=6).map("/".join), min_size=1, max_size=12))
def test_the_shard_directory_cache_answers_as_the_regex(directories: list[str]) -> None:
    """``directory_role`` keeps its shard answers per parent directory: with the cache, in any
    order of asking, every role is the one without it (its shard, what lies below, its tree)."""
    cache: dict = {}
    for directory in directories:
        for child in (directory, f"{directory}/00"):
            cached, fresh = LAYOUT.directory_role(child, cache), LAYOUT.directory_role(child, None)
            if fresh is None:
                assert cached is None, child
                continue
            assert cached is not None, child
            assert (cached.entry, cached.spread_of, cached.entries_below, cached.shards_below) == (
                fresh.entry, fresh.spread_of, fresh.entries_below, fresh.shards_below), child
            assert (cached.shard is None) == (fresh.shard is None), child
            if fresh.shard is None:
                continue
            for field in ("namespace", "base", "entry_dir", "name_dir", "shard", "suffixes", "key_prefix"):
                assert getattr(cached.shard, field) == getattr(fresh.shard, field), (child, field)
