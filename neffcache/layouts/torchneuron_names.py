"""Where TorchNeuron's two writers put their files in ``TORCH_NEURONX_NEFF_CACHE_DIR`` (torchneuron).

Two writers share one directory (docs/runtimes.md, "torchneuron"; NEURON_FACTS.md §1)::

    ab/cd/<key>.neff       the C++ backend (eager ops, torch.compile graphs): <key> is an
                           XXH3-128, 32 hex; written as <ab/cd>/.tmp.XXXXXX (mkstemp) + rename
    <K>/<K>.neff           the Python kernel path: <K> is a sha256, 64 hex, the directory and
                           the file named alike; written as <K>/tmpXXXXXXXX.tmp
                           (NamedTemporaryFile) + rename

neffcache's own API (:mod:`neffcache.keys`) keeps its entries in the C++ writer's form with 64
hex digits. So 64 hex digits alone do not say where an entry's NEFF lies: a kernel entry's
**key is** ``<K>/<K>`` (its NEFF's path in the tree, suffix dropped), which every function here
tells from a sharded key by its ``/``. A name is mapped to one entry or none; pure functions of
strings, no I/O, so :class:`~neffcache.layouts.torchneuron.TorchNeuronLayout` and the scan's
shard directories (:class:`~neffcache.layouts.records.ShardDir`) agree by construction.

The temp names are the runtime's own (neither entries nor neffcache's garbage); a dead writer's
are debris after :data:`TEMP_DEBRIS_AFTER`, far past any write in flight: the runtime's lock
waiters give up after ``TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT`` (1200 s by default).
"""

from __future__ import annotations

import re

from neffcache.layouts.records import TARGET_DIR_RE

NEFF_TREE = "neff"  # the tree of NEFFs in a managed namespace (TORCH_NEURONX_NEFF_CACHE_DIR)
HLO_TREE = "hlo"  # neffcache's tree of HLOs beside it (TORCH_NEURONX_HLO_CACHE_DIR)
TREES = (HLO_TREE, NEFF_TREE)  # the two trees an entry's files lie in, at the same shard path
NEFF = ".neff"  # the file whose presence makes an entry SUCCESS: the runtime's commit marker
MANIFEST = ".neffcache.json"
HLO = ".hlo"
FLAGS = ".flags.json"
SHARDED_SUFFIXES = frozenset((MANIFEST, FLAGS, NEFF, HLO))
NEFF_SUFFIXES = frozenset((NEFF, MANIFEST))  # what a NEFF directory (bare, or a kernel's) holds
KERNEL_KEY_LEN = 64
TEMP_DEBRIS_AFTER = 24 * 3600.0

_HEX = "0123456789abcdef"
_SHARDED_KEY = r"(?P<key>[0-9a-f]{32,64})"
_KERNEL = r"(?P<k>[0-9a-f]{64})/(?P=k)"
_NS = "(?P<ns>" + TARGET_DIR_RE + r"torchneuron-(?P<ver>[0-9][^/]*))"
# ``\Z``, not ``$``: a name ending in a newline is not the runtime's (``$`` matches before it).
MANAGED_RE = re.compile(
    "^" + _NS + r"/(?P<kind>neff|hlo)/(?P<a>[0-9a-f]{2})/(?P<b>[0-9a-f]{2})/" + _SHARDED_KEY
    + r"(?P<suffix>\.[a-z.]+)\Z")
BARE_RE = re.compile(r"^(?P<a>[0-9a-f]{2})/(?P<b>[0-9a-f]{2})/" + _SHARDED_KEY + r"(?P<suffix>\.[a-z.]+)\Z")
KERNEL_MANAGED_RE = re.compile("^" + _NS + r"/neff/" + _KERNEL + r"(?P<suffix>\.[a-z.]+)\Z")
KERNEL_BARE_RE = re.compile("^" + _KERNEL + r"(?P<suffix>\.[a-z.]+)\Z")
MANAGED_SHARD_RE = re.compile("^" + _NS + r"/(?:neff|hlo)/(?P<a>[0-9a-f]{2})/(?P<b>[0-9a-f]{2})\Z")
BARE_SHARD_RE = re.compile(r"^(?P<a>[0-9a-f]{2})/(?P<b>[0-9a-f]{2})\Z")
KERNEL_DIR_RE = re.compile(r"^(?:" + _NS + r"/neff/)?(?P<k>[0-9a-f]{64})\Z")
TREE_DIR_RE = re.compile("^" + _NS + r"/(?:neff|hlo)\Z")
# The writers' temp files: the C++ backend's mkstemp in a shard directory (six characters), the
# kernel path's NamedTemporaryFile in its key directory (``tmp`` + eight, then ``.tmp``).
_TEMP_RE = re.compile(
    r"^(?:" + _NS + r"/neff/)?(?:[0-9a-f]{2}/[0-9a-f]{2}/\.tmp\.[A-Za-z0-9_]{6}"
    r"|[0-9a-f]{64}/tmp[a-z0-9_]{8}\.tmp)\Z")
_LEAF_DIR_RE = re.compile(r"(?:^|/)(?:[0-9a-f]{2}/[0-9a-f]{2}|[0-9a-f]{64})\Z")


def is_kernel_key(key: str) -> bool:
    """Whether ``key`` names a kernel entry (``<K>/<K>``) rather than a sharded one."""
    return "/" in key


def kernel_key(digest: str) -> str:
    return f"{digest}/{digest}"


def neff_tree_path(key: str) -> str:
    """Where the entry of ``key`` lies in a NEFF tree (suffix dropped): ``ab/cd/<key>`` for a
    sharded key, the key itself (``<K>/<K>``) for a kernel's."""
    return key if "/" in key else f"{key[0:2]}/{key[2:4]}/{key}"


def claims_key(key: str) -> bool:
    """Whether ``key`` has either writer's form (32-64 hex, or 64 hex twice around a ``/``)."""
    if "/" in key:
        first, _, second = key.partition("/")
        return first == second and len(first) == KERNEL_KEY_LEN and not first.strip(_HEX)
    return 32 <= len(key) <= 64 and not key.strip(_HEX)


def is_temp_file(path: str) -> bool:
    """A writer's temp file: the C++ ``<ab/cd>/.tmp.XXXXXX`` or the kernel path's
    ``<K>/tmpXXXXXXXX.tmp``, in a managed namespace's NEFF tree or a bare NEFF directory."""
    return _TEMP_RE.match(path) is not None


def group_dir(entry_path: str) -> str | None:
    """The directory an entry's prune group is named by: the NEFF tree (or bare root) that
    holds its shard or kernel directory, whose one or two entries would otherwise each cost a
    lease of their own (coordination/write_leases.py). None: not a path of this layout's form."""
    directory = entry_path.rpartition("/")[0]
    if _LEAF_DIR_RE.search(directory) is None:
        return None
    return _LEAF_DIR_RE.sub("", directory)
