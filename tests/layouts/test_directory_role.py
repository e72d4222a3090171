"""What each directory is to each layout (``Layout.directory_role``): one table per layout, every
role a scan relies on (entry directories, namespace directories, shard directories, spread trees,
bare NEFF and kernel directories) and the directories that must be nothing to it (``.neffcache``,
names with spaces, a ``MODULE_`` directory outside a namespace). And the merge of a level's
per-tree rules (``Grouper.plain_rule``) declines when the trees disagree."""

from __future__ import annotations

import pytest

from neffcache.entry import Namespace
from neffcache.layouts import get_layout
from neffcache.layouts import torchneuron_names as tn
from neffcache.layouts.neuronxcc import KNOWN
from neffcache.layouts.records import DirectoryRole, Located, ShardDir
from neffcache.scan.grouping import Grouper, merged_shards_below
from neffcache.stores.plain import PlainEntryDirs, PlainFiles

K = "ab" + "1" * 62  # a kernel's sha256
HEX_PAIRS = frozenset(f"{i:02x}" for i in range(256))
SHARDED = tuple(sorted(tn.SHARDED_SUFFIXES))
NEFF_DIR = tuple(sorted(tn.NEFF_SUFFIXES))

XCC = Namespace("neuronxcc", "trn2-lnc2/neuronxcc-2.9.0", "2.9.0", "trn2", 2)
XCC_BARE = Namespace("neuronxcc", "neuronxcc-2.9.0", "2.9.0")
TN = Namespace("torchneuron", "trn2-lnc2/torchneuron-2.9.0", "2.9.0", "trn2", 2)
TN_BARE = Namespace("torchneuron", "", None)
VLLM = Namespace("vllm", "trn2-lnc2/vllm-0.9.1", "0.9.1", "trn2", 2)
VLLM_BARE = Namespace("vllm", "", None)
NXDI = Namespace("nxdi", "trn2-lnc2/nxdi-2.9.0", "2.9.0", "trn2", 2)
NXDI_BARE = Namespace("nxdi", "", None)
H = "0123456789abcdef" * 2  # a 32-hex config hash or MD5


def entry(ns: Namespace, key: str, directory: str, *, flat: bool = False) -> DirectoryRole:
    return DirectoryRole(entry=Located(ns, key, directory, directory, ""), flat=flat)


def entries_below(ns: Namespace) -> DirectoryRole:
    return DirectoryRole(entries_below=PlainEntryDirs(
        "MODULE_", "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_+", tuple(sorted(KNOWN)),
        ("model.done", "model.neff"), "model.neff", ns))


def shard(ns: Namespace, entry_dir: str, name_dir: str, digits: str, suffixes: frozenset[str],
          key_prefix: str = "") -> DirectoryRole:
    return DirectoryRole(shard=ShardDir(ns, ns.path, entry_dir, name_dir, digits, suffixes, key_prefix=key_prefix))


def shards_below(ns: Namespace, prefix: str, suffixes: tuple[str, ...], primary: frozenset[str]) -> DirectoryRole:
    return DirectoryRole(shards_below=PlainFiles(HEX_PAIRS, prefix, suffixes, ".neff", primary, 32, 64, ns))


NOTHING = ["", "trn2-lnc2", ".neffcache", ".neffcache/trn2-lnc2/neuronxcc-2.9.0",
           ".neffcache/trn2-lnc2/neuronxcc-2.9.0/MODULE_1+abc", ".neffcache/ab/cd", ".neffcache/ab",
           "x/MODULE_1+abc", "MODULE_1+abc", "a b/c d", "trn2-lnc2/neuronxcc-2.9.0/MODULE_1+abc/sub"]

TABLES: dict[str, list[tuple[str, DirectoryRole | None]]] = {
    "neuronxcc": [
        (f"{XCC.path}/MODULE_1+abc", entry(XCC, "MODULE_1+abc", f"{XCC.path}/MODULE_1+abc", flat=True)),
        (f"{XCC_BARE.path}/MODULE_x_y+Z9", entry(XCC_BARE, "MODULE_x_y+Z9", f"{XCC_BARE.path}/MODULE_x_y+Z9",
                                                 flat=True)),
        (f"{XCC.path}/MODULE_a b+1", entry(XCC, "MODULE_a b+1", f"{XCC.path}/MODULE_a b+1", flat=True)),
        (XCC.path, entries_below(XCC)),
        (XCC_BARE.path, entries_below(XCC_BARE)),
        (f"{XCC.path}/MODULE_", None),
        ("trn2-lnc2/neuronxcc-x", None),
        ("trn2-lnc2/neuronxcc-x/MODULE_1+abc", None),
        ("x/neuronxcc-2.9.0", None),
        ("bad-lnc2/neuronxcc-2.9.0/MODULE_1+abc", None),
        (f"{TN.path}/neff/ab/cd", None),
        (f"{VLLM.path}/{H}", None),
    ],
    "torchneuron": [
        (f"{TN.path}/neff/ab/cd", shard(TN, f"{TN.path}/neff/ab/cd/", "neff/ab/cd/", "abcd", tn.SHARDED_SUFFIXES)),
        (f"{TN.path}/hlo/ab/cd", shard(TN, f"{TN.path}/neff/ab/cd/", "hlo/ab/cd/", "abcd", tn.SHARDED_SUFFIXES)),
        (f"{TN.path}/neff/ab", shards_below(TN, "ab", SHARDED, frozenset({f"{TN.path}/neff/ab"}))),
        (f"{TN.path}/hlo/ab", shards_below(TN, "ab", SHARDED, frozenset())),
        (f"{TN.path}/neff", DirectoryRole(spread_of=TN.path)),
        (f"{TN.path}/hlo", DirectoryRole(spread_of=TN.path)),
        ("torchneuron-2.9.0/neff", DirectoryRole(spread_of="torchneuron-2.9.0")),
        ("ab/cd", shard(TN_BARE, "ab/cd/", "ab/cd/", "abcd", tn.NEFF_SUFFIXES)),
        ("ab", shards_below(TN_BARE, "ab", NEFF_DIR, frozenset({"ab"}))),
        (f"{TN.path}/neff/{K}", shard(TN, f"{TN.path}/neff/", f"neff/{K}/", K, tn.NEFF_SUFFIXES, f"{K}/")),
        (K, shard(TN_BARE, "", f"{K}/", K, tn.NEFF_SUFFIXES, f"{K}/")),
        (f"{TN.path}/hlo/{K}", None),
        (f"{TN.path}/neff/{K.upper()}", None),
        (f"1{K}", None),
        (f"{TN.path}/neff/AB/cd", None),
        (f"{TN.path}/neff/ab/cd/ef", None),
        (f"{TN.path}/other/ab/cd", None),
        ("ab/cd/ef", None),
        ("x/neff", None),
        ("neff", None),
        (f"{TN.path}/neff/ab/c d", None),
        (f"{XCC.path}/MODULE_1+abc", None),
    ],
    "vllm": [
        (f"{VLLM.path}/{H}", entry(VLLM, H, f"{VLLM.path}/{H}")),
        (H, entry(VLLM_BARE, H, H)),
        (f"{VLLM.path}/neuron/compile_cache/m-1.x", entry(VLLM, "m-1.x", f"{VLLM.path}/neuron/compile_cache/m-1.x")),
        ("neuron/compile_cache/m", entry(VLLM_BARE, "m", "neuron/compile_cache/m")),
        (f"{VLLM.path}/{H.upper()}", None),
        (f"{VLLM.path}/neuron/compile_cache/a b", None),
        (f"{VLLM.path}/neuron/compile_cache", None),
        (VLLM.path, None),
    ],
    "nxdi": [
        (f"{NXDI.path}/{H}", entry(NXDI, H, f"{NXDI.path}/{H}")),
        (f"neuron-compiled-artifacts/{H}", entry(NXDI_BARE, H, f"neuron-compiled-artifacts/{H}")),
        (f"{NXDI.path}/{H}/weights", None),
        (f"x/{H}", None),
        (NXDI.path, None),
    ],
}


def _comparable(role: DirectoryRole | None) -> object:
    """A role with its shard's fields spelled out (ShardDir has no equality of its own)."""
    if role is None or role.shard is None:
        return role
    s = role.shard
    return role._replace(shard=(s.namespace, s.base, s.entry_dir, s.name_dir, s.shard, s.suffixes, s.key_prefix))


@pytest.mark.parametrize("layout", sorted(TABLES))
def test_each_directory_has_the_role_the_table_says(layout: str) -> None:
    lay = get_layout(layout)
    rows = TABLES[layout] + [(d, None) for d in NOTHING if d not in dict(TABLES[layout])]
    namespaces: dict[str, Namespace | None] = {}
    for _ in range(2):  # asked again with the cache filled: the same answers
        for directory, expected in rows:
            assert _comparable(lay.directory_role(directory)) == _comparable(expected), directory
            assert _comparable(lay.directory_role(directory, namespaces)) == _comparable(expected), directory
    for directory, expected in rows:
        if expected is not None and expected.entry is not None:
            assert lay.entry_is_dir and expected.entry.namespace.layout == layout
            assert lay.locate_entry(directory) is not None, directory


def test_a_role_says_one_thing_in_each_table() -> None:
    """No directory of the tables is two things to one layout, and no two layouts claim one
    directory: a scan takes the first answer, so they must not compete."""
    claimed: dict[str, str] = {}
    for layout, rows in TABLES.items():
        for directory, _ in rows:
            got = get_layout(layout).directory_role(directory)
            if got is None:
                continue
            assert sum(field not in (None, False) for field in got) == 1 + got.flat, directory
            assert claimed.setdefault(directory, layout) == layout, directory


NS_B = "trn1-lnc1/torchneuron-2.9.0"


def test_a_level_whose_trees_disagree_has_no_rule() -> None:
    grouper = Grouper()
    both = grouper.plain_rule([f"{TN.path}/hlo/ab", f"{TN.path}/neff/ab"])
    assert both is not None and both.primary_dirs == {f"{TN.path}/neff/ab"} and both.prefix == "ab"
    for disagreeing in ([f"{TN.path}/hlo/ab", f"{NS_B}/neff/ab"],  # namespaces
                        [f"{TN.path}/hlo/ab", f"{TN.path}/neff/cd"],  # prefixes
                        [f"{TN.path}/neff/ab", "ab"],  # suffixes and namespaces: managed and bare
                        [f"{TN.path}/neff/ab", f"{TN.path}/neff"],  # one tree has no rule
                        [f"{TN.path}/neff/ab", f"{XCC.path}"]):  # nor another layout's
        assert grouper.plain_rule(disagreeing) is None, disagreeing


def test_the_merge_takes_the_union_of_primary_dirs_and_declines_any_difference() -> None:
    hlo = PlainFiles(HEX_PAIRS, "ab", SHARDED, ".neff", frozenset(), 32, 64, TN)
    neff = hlo._replace(primary_dirs=frozenset({"n/ab"}))
    assert merged_shards_below([hlo, neff]) == neff
    assert merged_shards_below([neff, neff._replace(primary_dirs=frozenset({"m/ab"}))]) == neff._replace(
        primary_dirs=frozenset({"n/ab", "m/ab"}))
    assert merged_shards_below([hlo]) == hlo
    assert merged_shards_below([]) is None
    assert merged_shards_below([hlo, None]) is None and merged_shards_below([None, neff]) is None
    for field, other in (("namespace", Namespace("torchneuron", NS_B, "2.9.0", "trn1", 1)), ("prefix", "cd"),
                         ("suffixes", NEFF_DIR), ("primary", ".hlo"), ("key_min", 33), ("key_max", 63),
                         ("children", frozenset({"00"}))):
        assert merged_shards_below([hlo, neff._replace(**{field: other})]) is None, field
        assert merged_shards_below([neff._replace(**{field: other}), hlo]) is None, field
