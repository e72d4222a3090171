"""Layout B: TorchNeuron's native NEFF cache (``torch.compile(backend="neuron")``, eager ops).

::

    <root>/[<target>-lnc<N>/]torchneuron-<version>/
        neff/<k0k1>/<k2k3>/<key>.neff            TORCH_NEURONX_NEFF_CACHE_DIR: the commit marker
        neff/<k0k1>/<k2k3>/<key>.neffcache.json  neffcache's manifest, beside the NEFF
        neff/<k0k1>/<k2k3>/<key>.neff.tmp.XXXXXX the runtime's write in flight (then renamed)
        hlo/<k0k1>/<k2k3>/<key>.hlo              TORCH_NEURONX_HLO_CACHE_DIR: the HLO, to recompile
        hlo/<k0k1>/<k2k3>/<key>.flags.json

Keys (docs/runtimes.md, "Layout B"): the runtime names a NEFF by a 128-bit XXH3 hash, **32 hex**, of the
op's base key, ``_<target>_<lnc>_<opt>_<flags>`` and the IR bytes; neffcache's own API
(:func:`neffcache.keys.cache_key`) uses 64 hex. Both are accepted (32 to 64 hex): neffcache
reads the keys the runtime wrote and never computes the runtime's.

Versions: the key the public source copy computes carries no compiler version (the release
docs say it does): neffcache versions the *directory* (``torchneuron-<version>/``), which is
safe either way. A bare NEFF directory a job filled directly (``ab/cd/<key>.neff`` at the
root) is read as one namespace of unknown toolchain.

Temp files: the runtime writes ``<key>.neff.tmp.XXXXXX`` and renames it. Such a file is the
runtime's (:meth:`TorchNeuronLayout.is_runtime_file`): neither an entry nor neffcache's garbage,
so a scan does not count it and ``prune`` never removes it. The writer's lock lives on its own
host's local disk, so from the shared mount an in-flight write cannot be told from a dead one;
:meth:`TorchNeuronLayout.runtime_debris_after` says after how long one is surely dead (a day,
far past the runtime's 1200 s lock breaking), for a sweep that wants to offer its removal.

Locks: flock files on local disk, *outside* the cache
(``$TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR/locks/<key>.lock``, default ``/tmp/local_cache``; the
runtime breaks one older than 1200 s). Nothing in the store is a lock, so no entry is ever
LOCKED and ``prune --stale-locks`` has nothing to do here.

Log lines: ``[NEFF_CACHE] Cache HIT|MISS for key: <k>`` and ``Storing NEFF for key: <k>``,
where ``<k>`` is a readable op key (``aten::add_t0_(3, 3)_...``), not the file name: they are
counted per namespace and name no entry. There is no failure line: a failed compile surfaces
as a Python exception (the workload's exit status).

Warming and rewarming: warming layout B means running the workload compile-only
(``neffcache warm``): the runtime computes and writes its own keys. ``neffcache rewarm`` can
only recompile what has an HLO under neffcache's layout-B namespace (``hlo/ab/cd/<key>.hlo``)
and publishes it under neffcache's own key (HLO bytes, flags, new toolchain): ``NeffCache.get``
serves those, but the native runtime, whose key neffcache cannot compute, will not find them.
For the native runtime, warm the new toolchain with the workload instead.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.layouts.base import Layout
from neffcache.layouts.records import (
    TARGET_DIR_RE,
    EntryNames,
    EntryPlan,
    Located,
    LogLine,
    ShardDir,
    parse_target_dir,
)
from neffcache.manifest import Manifest
from neffcache.stores.plain import PlainFiles
from neffcache.toolchain import Toolchain

_FLAGS_SUFFIX = ".flags.json"
_NEFF_SUFFIX = ".neff"  # names_for's NEFF: the file whose presence makes an entry SUCCESS
_SUFFIXES = (".neffcache.json", _FLAGS_SUFFIX, _NEFF_SUFFIX, ".hlo")
_KEY = r"(?P<key>[0-9a-f]{32,64})"
_KEY_ONLY_RE = re.compile(_KEY + "$")
_HLO_NAME_RE = re.compile(r"(?:^|/)" + _KEY + r"\.hlo$")
_MANAGED_RE = re.compile(
    "^" + TARGET_DIR_RE + r"torchneuron-(?P<ver>[0-9][^/]*)/(?P<kind>neff|hlo)/"
    r"(?P<a>[0-9a-f]{2})/(?P<b>[0-9a-f]{2})/" + _KEY + r"(?P<suffix>\.[a-z.]+)$"
)
_BARE_RE = re.compile(r"^(?P<a>[0-9a-f]{2})/(?P<b>[0-9a-f]{2})/" + _KEY + r"(?P<suffix>\.[a-z.]+)$")
_TREES = ("hlo", "neff")  # the two trees an entry's files lie in, at the same shard path
_NEFF_TREE = "neff"  # the one of them a managed namespace keeps its NEFFs in (names_for)
# A shard directory, resolved once for its files (:meth:`TorchNeuronLayout.shard_dir`). ``\Z``,
# not ``$``: a directory named ``cd\n`` is not a shard (``$`` would match before the newline).
_MANAGED_DIR_RE = re.compile(
    "^(?P<ns>" + TARGET_DIR_RE + r"torchneuron-(?P<ver>[0-9][^/]*))/(?:" + "|".join(_TREES) + r")/"
    r"(?P<a>[0-9a-f]{2})/(?P<b>[0-9a-f]{2})\Z"
)
_TREE_DIR_RE = re.compile("^(?P<ns>" + TARGET_DIR_RE + r"torchneuron-[0-9][^/]*)/(?:" + "|".join(_TREES) + r")\Z")
_BARE_DIR_RE = re.compile(r"^(?P<a>[0-9a-f]{2})/(?P<b>[0-9a-f]{2})\Z")
_MANAGED_SUFFIXES = frozenset(_SUFFIXES)
_HEX_PAIRS = frozenset(f"{i:02x}" for i in range(256))
_UNKNOWN = Namespace("", "\0", None)  # a cache miss in shard_dir's namespaces
_BARE_SUFFIXES = frozenset((_NEFF_SUFFIX, ".neffcache.json"))
# The runtime's in-flight write: mkstemp's six characters after ``<key>.neff.tmp.``.
_TEMP_RE = re.compile(
    r"^(?:" + TARGET_DIR_RE + r"torchneuron-[0-9][^/]*/neff/)?"
    r"(?P<a>[0-9a-f]{2})/(?P<b>[0-9a-f]{2})/" + _KEY + r"\.neff\.tmp\.[A-Za-z0-9_]{6}$"
)
TEMP_DEBRIS_AFTER = 24 * 3600.0
LOCK_BREAK_SECONDS = 1200  # the runtime breaks a lock older than this
LOCAL_DIR_VAR = "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"
LOCAL_DIR_DEFAULT = "/tmp/local_cache"  # noqa: S108 (the runtime's default, quoted)
_LOG_RE = re.compile(r"\[NEFF_CACHE\] (?:Cache (?P<hm>HIT|MISS)|(?P<store>Storing NEFF)) for key: (?P<key>.*\S)")


def shard(key: str) -> str:
    return f"{key[0:2]}/{key[2:4]}/{key}"


class TorchNeuronLayout(Layout):
    name = "torchneuron"
    runtime_dir = "torchneuron"
    needs_filesystem = True  # the runtime reads a directory; it has no S3 backend

    def names(self, namespace: Namespace, key: str) -> EntryNames:
        names = self.names_for(namespace, key)
        return EntryNames(hlo=names["hlo"], flags=names["flags"], neff=names["neff"], marker=names["neff"],
                          manifest=names["manifest"])

    def namespace_for(self, toolchain: Toolchain) -> Namespace:
        path = f"{toolchain.target_dir}/torchneuron-{toolchain.compiler_version}"
        return Namespace(self.name, path, toolchain.compiler_version, toolchain.target, toolchain.lnc)

    @staticmethod
    def names_for(namespace: Namespace, key: str) -> dict[str, str]:
        sharded = shard(key)  # once: a scan asks this of every entry
        neff = sharded if namespace.path == "" else f"{_NEFF_TREE}/{sharded}"
        return {
            "neff": f"{neff}.neff",
            "manifest": f"{neff}.neffcache.json",
            "hlo": f"hlo/{sharded}.hlo",
            "flags": f"hlo/{sharded}{_FLAGS_SUFFIX}",
        }

    def locate(self, path: str) -> Located | None:
        match = _MANAGED_RE.match(path)
        if match:
            if match.group("a") + match.group("b") != match.group("key")[:4]:
                return None
            suffix = match.group("suffix")
            if suffix not in _SUFFIXES:
                return None
            target, lnc = parse_target_dir(match)
            head = path.split("/torchneuron-", 1)[0] if match.group("tdir") else ""
            ns_path = posixpath.join(head, f"torchneuron-{match.group('ver')}") if head else (
                f"torchneuron-{match.group('ver')}"
            )
            ns = Namespace(self.name, ns_path, match.group("ver"), target, lnc)
            key = match.group("key")
            name = path[len(ns_path) + 1:]
            return Located(ns, key, posixpath.join(ns_path, "neff", shard(key)), ns_path, name)
        match = _BARE_RE.match(path)
        if match and match.group("suffix") in (".neff", ".neffcache.json"):
            if match.group("a") + match.group("b") != match.group("key")[:4]:
                return None
            ns = Namespace(self.name, "", None)
            key = match.group("key")
            return Located(ns, key, shard(key), "", path)
        return None

    # An entry's files lie in two trees, at the same shard path in each (the module docstring).
    spread_trees = _TREES

    def spread_namespace(self, directory: str) -> str | None:
        match = _TREE_DIR_RE.match(directory)
        return match.group("ns") if match else None

    def shard_dir(self, directory: str, namespaces: dict[str, Namespace | None] | None = None
                  ) -> ShardDir | None:
        # What locate() decides from a file's directory, decided once per shard: the same
        # regexes up to the file name, so a file key_of() accepts is placed as locate() would.
        ns = self._managed_shard(directory, namespaces)
        if ns is not None:
            a, b = directory[-5:-3], directory[-2:]
            return ShardDir(ns, ns.path, f"{ns.path}/{_NEFF_TREE}/{a}/{b}/", directory[len(ns.path) + 1:] + "/",
                            a + b, _MANAGED_SUFFIXES)
        match_bare = _BARE_DIR_RE.match(directory)
        if match_bare is None:
            return None
        bare = namespaces.get("") if namespaces is not None else None
        if bare is None:
            bare = Namespace(self.name, "", None)
            if namespaces is not None:
                namespaces[""] = bare
        return ShardDir(bare, "", directory + "/", directory + "/", match_bare.group("a") + match_bare.group("b"),
                        _BARE_SUFFIXES)

    def _managed_shard(self, directory: str, namespaces: dict[str, Namespace | None] | None
                       ) -> Namespace | None:
        """The namespace of ``directory`` when ``_MANAGED_DIR_RE`` matches it. Its siblings
        share the answer: the regex ends in a last name of two hex digits and the end, so for such a
        last name it matches exactly when it matched a sibling's. ``namespaces`` keeps the
        answer by parent (under a key with a NUL, which no namespace path holds), so a scan runs
        the regex once per ``ab`` directory, not once per shard: 256 times fewer."""
        parent, leaf = directory[:-3], directory[-2:]
        hex_leaf = directory[-3:-2] == "/" and leaf in _HEX_PAIRS
        if hex_leaf and namespaces is not None:
            known = namespaces.get("\0" + parent, _UNKNOWN)
            if known is not _UNKNOWN:
                return known
        match = _MANAGED_DIR_RE.match(directory)
        ns = None
        if match is not None:
            ns_path = match.group("ns")
            ns = namespaces.get(ns_path) if namespaces is not None else None
            if ns is None:
                target, lnc = parse_target_dir(match)
                ns = Namespace(self.name, ns_path, match.group("ver"), target, lnc)
                if namespaces is not None:
                    namespaces[ns_path] = ns
        if hex_leaf and namespaces is not None:
            namespaces["\0" + parent] = ns
        return ns

    def is_runtime_file(self, path: str) -> bool:
        return self._temp_file(path)

    def claims_key(self, key: str) -> bool:
        # The runtime's 32-hex keys and neffcache's own 64-hex ones share the namespace.
        return _KEY_ONLY_RE.match(key) is not None

    def flags_beside(self, file_name: str) -> tuple[str, ...]:
        match = _HLO_NAME_RE.search(file_name)
        return (f"{match.group('key')}{_FLAGS_SUFFIX}",) if match else ()

    def runtime_debris_after(self, path: str) -> float | None:
        return TEMP_DEBRIS_AFTER if self._temp_file(path) else None

    @staticmethod
    def _temp_file(path: str) -> bool:
        match = _TEMP_RE.match(path)
        return match is not None and match.group("a") + match.group("b") == match.group("key")[:4]

    def parse_log_line(self, line: str) -> LogLine | None:
        match = _LOG_RE.search(line)
        if match is None:
            return None
        kind = "success" if match.group("store") else match.group("hm").lower()
        return LogLine(kind, key=match.group("key"))

    def env_notes(self, root: str, namespace: Namespace) -> list[str]:
        return [
            f"TorchNeuron's native key carries no compiler version: neffcache versions the directory "
            f"({posixpath.basename(namespace.path)}/); keep one directory per compiler",
            f"TorchNeuron's native locks live on local disk, outside the cache: "
            f"${LOCAL_DIR_VAR}/locks/<key>.lock (default {LOCAL_DIR_DEFAULT}, flock, broken after "
            f"{LOCK_BREAK_SECONDS} s); keep {LOCAL_DIR_VAR} off the shared mount",
        ]

    def plan_entry(self, namespace: Namespace, key: str) -> EntryPlan:
        names = self.names_for(namespace, key)
        path = posixpath.join(namespace.path, "neff", shard(key)) if namespace.path else shard(key)
        return EntryPlan(namespace, key, path, namespace.path, names["manifest"], names["neff"])

    def write_order(self, names: list[str], marker: str, manifest: str) -> list[str]:
        # Manifest first (a manifest without its NEFF reads as uncommitted), NEFF last: it commits.
        rank = {manifest: 0, marker: 9}
        return sorted(names, key=lambda n: (rank.get(n, 1), n))

    def private_env(self, scratch: str) -> dict[str, str]:
        # Its compile locks live in a local directory shared by every job of the host
        # (default /tmp/local_cache); a plan's recording compiles must not hold those.
        return {LOCAL_DIR_VAR: posixpath.join(scratch, "torchneuron-local")}

    def job_env(self, root: str, namespace: Namespace) -> dict[str, str]:
        ns_root = posixpath.join(root, namespace.path) if namespace.path else root
        env = {"TORCH_NEURONX_NEFF_CACHE_DIR": posixpath.join(ns_root, "neff") if namespace.path else ns_root}
        if namespace.path:
            env["TORCH_NEURONX_HLO_CACHE_DIR"] = posixpath.join(ns_root, "hlo")
        return env

    def classify(
        self, located: Located, files: Mapping[str, FileInfo], manifest: Manifest | None,
        manifest_error: str | None = None,
    ) -> Entry:
        names = self.names_for(located.namespace, located.key)
        problems: list[str] = []
        if manifest_error:
            problems.append(manifest_error)
        if manifest is not None:
            problems.extend(self.manifest_problems(files, manifest, located))
        neff = files.get(names["neff"])
        committed = True
        if neff is None and names["manifest"] in files:
            state, committed = EntryState.CORRUPT, False
            problems.append("uncommitted: a manifest without its NEFF (an interrupted or ongoing write)")
        elif problems:
            state = EntryState.CORRUPT
        elif neff is not None:
            state = EntryState.SUCCESS
            if neff.size == 0:
                state, problems = EntryState.CORRUPT, ["the NEFF is empty"]
        else:
            state = EntryState.EMPTY
        return self.entry_at(located, files, state, problems, manifest, manifest_name=names["manifest"],
                             marker_name=names["neff"], committed=committed)

    def plain_entries(self, shards: Sequence[tuple[ShardDir, Sequence[str], Sequence[FileInfo]]]
                      ) -> tuple[int, int] | None:
        """:meth:`Layout.plain_entries`: what :meth:`classify` decides from the files alone,
        without a manifest or a problem, is SUCCESS exactly when the NEFF (``names_for``'s
        ``neff``) is present and not empty; every file of the entry counts in its size.

        Per shard, only the plain names (:meth:`ShardDir.key_of`) are taken: any other name
        declines the whole batch (``locate`` decides it). A key's NEFF is ``<key>.neff`` in
        the shard directory of the key's first four digits (every key ``key_of`` accepts here)
        in the NEFF tree of a managed namespace, or in the bare directory itself
        (``names_for``): so whether a shard holds NEFFs is one answer for all its keys."""
        sizes: dict[str, int] = {}
        with_neff: set[str] = set()
        for shard, names, files in shards:
            key_of = shard.key_of
            holds_neffs = _holds_neffs(shard)
            for name, info in zip(names, files, strict=True):
                key = key_of(name)
                if key is None:
                    return None
                size = info.size
                sizes[key] = sizes.get(key, 0) + size
                if holds_neffs and len(name) == len(key) + len(_NEFF_SUFFIX) and name.endswith(_NEFF_SUFFIX):
                    if size == 0:
                        return None  # CORRUPT: the NEFF is empty
                    with_neff.add(key)
        if len(with_neff) != len(sizes):
            return None  # EMPTY, or uncommitted (a manifest without its NEFF)
        return len(sizes), sum(sizes.values())

    def plain_files_below(self, directories: Sequence[str], namespaces: dict[str, Namespace | None] | None = None
                          ) -> PlainFiles | None:
        """:meth:`Layout.plain_files_below`: when ``<d>/00`` is a shard directory for each
        directory ``d``, so is ``<d>/<xy>`` for every pair of lowercase hex digits, with the
        same namespace, suffixes and name prefix, and the shard ``d``'s last two digits plus
        ``xy``: both regexes (``_MANAGED_DIR_RE``, ``_BARE_DIR_RE``) end in a last name of two
        hex digits and the end, the argument ``_managed_shard`` caches by. So
        :meth:`plain_entries`' rule for those children is one rule: :meth:`ShardDir.key_of`'s
        names, NEFFs where ``_holds_neffs`` says (tests/stores/test_count_plain.py holds the
        rule to ``shard_dir`` of each child)."""
        shards = []
        for directory in directories:
            shard = self.shard_dir(f"{directory}/00", namespaces)
            if shard is None:
                return None
            shards.append(shard)
        first = shards[0]
        if any(s.namespace != first.namespace or s.suffixes != first.suffixes or s.shard != first.shard
               for s in shards):
            return None
        primary = frozenset(d for d, s in zip(directories, shards, strict=True) if _holds_neffs(s))
        return PlainFiles(_HEX_PAIRS, first.shard[:2], tuple(sorted(first.suffixes)), _NEFF_SUFFIX, primary,
                          ShardDir.KEY_MIN, ShardDir.KEY_MAX, first.namespace)

    # -- what scan, load_entry and prune ask (issue #11) ---------------------------------------
    def locate_entry(self, path: str) -> Located | None:
        # An entry's path is its NEFF's without the suffix (``.../neff/ab/cd/<key>``).
        return self.locate(f"{path}.neff")


def _holds_neffs(shard: ShardDir) -> bool:
    """Whether the NEFFs of ``shard``'s entries lie in it (``names_for``'s ``neff``): a
    managed namespace's NEFF tree, or a bare NEFF directory."""
    return not shard.namespace.path or shard.name_dir.startswith(_NEFF_TREE + "/")
