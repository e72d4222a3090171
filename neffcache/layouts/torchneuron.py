"""The torchneuron layout: TorchNeuron's native NEFF cache (``torch.compile(backend="neuron")``, eager ops).

::

    <root>/[<target>-lnc<N>/]torchneuron-<version>/
        neff/<k0k1>/<k2k3>/<key>.neff            TORCH_NEURONX_NEFF_CACHE_DIR, the C++ writer:
                                                 the NEFF is the commit marker
        neff/<k0k1>/<k2k3>/<key>.neffcache.json  neffcache's manifest, beside the NEFF
        neff/<k0k1>/<k2k3>/.tmp.XXXXXX           the C++ writer's write in flight (then renamed)
        neff/<K>/<K>.neff                        the Python kernel writer (sha256 <K>, 64 hex)
        neff/<K>/tmpXXXXXXXX.tmp                 its write in flight
        hlo/<k0k1>/<k2k3>/<key>.hlo              TORCH_NEURONX_HLO_CACHE_DIR: the HLO, to recompile
        hlo/<k0k1>/<k2k3>/<key>.flags.json

Where each writer puts what, and the kernel entries' ``<K>/<K>`` keys:
:mod:`neffcache.layouts.torchneuron_names`. Keys: the C++ writer names a NEFF by an XXH3-128,
**32 hex**, of the op's base key, ``_<target>_<lnc>_<opt>_<args>`` (``<opt>`` from
``NEURON_COMPILER_OPT_LEVEL``, ``<args>`` including ``$NEURON_CC_FLAGS``) and the IR bytes;
neffcache's own API (:func:`neffcache.keys.cache_key`) uses 64 hex in the same form. neffcache
reads the keys the runtimes wrote and never computes theirs.

Versions: the C++ key carries no compiler version (the kernel path's does): neffcache versions
the *directory* (``torchneuron-<version>/``), which is safe either way. A bare NEFF directory a
job filled directly (``ab/cd/<key>.neff``, ``<K>/<K>.neff`` at the root) is read as one
namespace of unknown toolchain.

Temp files are the runtime's (:meth:`TorchNeuronLayout.is_runtime_file`): neither an entry nor
neffcache's garbage, never removed young. The writer's lock lives on its own host's local disk,
so from the shared mount an in-flight write cannot be told from a dead one:
:meth:`TorchNeuronLayout.runtime_debris_after` says after how long one is surely dead (a day).

Locks: flock files on local disk, *outside* the cache (the variables that place and time them,
and those that turn the cache off or change every key: :mod:`neffcache.layouts.torchneuron_env`).
Nothing in the store is a lock, so no entry is ever LOCKED.

Log lines: ``[NEFF_CACHE] Cache HIT|MISS for key: <k>`` and ``Storing NEFF for key: <k>``, where
``<k>`` is a readable op key, not a file name. HIT and MISS come from an **in-process
dictionary** consulted before the disk cache: a MISS may be a disk hit, and a HIT is a graph
the process already had. So they are read as ``lookup`` and ``reuse``, never as cache hits and
misses: what the run compiled is counted from the NEFFs it added to the cache
(:attr:`Layout.counts_from_cache`). There is no failure line: a failed compile surfaces as a
Python exception (the workload's exit status).

Warming and rewarming: warming means running the workload compile-only (``neffcache warm``):
the runtime computes and writes its own keys. ``neffcache rewarm`` can only recompile what has an
HLO under neffcache's namespace (``hlo/ab/cd/<key>.hlo``) and publishes it under neffcache's own
key: ``NeffCache.get`` serves those, the native runtime will not find them.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.layouts import torchneuron_env as tenv
from neffcache.layouts import torchneuron_names as tn
from neffcache.layouts.base import Layout
from neffcache.layouts.records import (
    DirectoryRole,
    EntryNames,
    EntryPlan,
    EnvProblem,
    Located,
    LogLine,
    ShardDir,
    parse_target_dir,
)
from neffcache.manifest import Manifest
from neffcache.stores.plain import PlainFiles
from neffcache.toolchain import Toolchain

_NEFF_TREE = tn.NEFF_TREE
_NEFF_SUFFIX = tn.NEFF
_HEX_PAIRS = frozenset(f"{i:02x}" for i in range(256))
_new = tuple.__new__
_NAME_START = ("", "/")  # what precedes a last name: nothing (at the root) or a slash
_TREE_ENDS = tuple(f"/{tree}" for tree in tn.TREES)  # a spread tree's last name, below its namespace
_UNKNOWN = Namespace("", "\0", None)  # a cache miss in directory_role's namespaces
_HLO_NAME_RE = re.compile(r"(?:^|/)(?P<key>[0-9a-f]{32,64})\.hlo$")
_LOG_RE = re.compile(r"\[NEFF_CACHE\] (?:Cache (?P<hm>HIT|MISS)|(?P<store>Storing NEFF)) for key: (?P<key>.*\S)")
_LOG_KINDS = {"HIT": "reuse", "MISS": "lookup"}


def shard(key: str) -> str:
    return tn.neff_tree_path(key)


class TorchNeuronLayout(Layout):
    name = "torchneuron"
    runtime_dir = "torchneuron"
    needs_filesystem = True  # the runtime reads a directory; it has no S3 backend
    counts_from_cache = True  # its lines name op keys, and a MISS may be a disk hit (module docstring)

    def names(self, namespace: Namespace, key: str) -> EntryNames:
        names = self.names_for(namespace, key)
        neff, manifest = names["neff"], names["manifest"]
        assert neff is not None and manifest is not None
        return EntryNames(hlo=names["hlo"], flags=names["flags"], neff=neff, marker=neff, manifest=manifest)

    def namespace_for(self, toolchain: Toolchain) -> Namespace:
        path = f"{toolchain.target_dir}/torchneuron-{toolchain.compiler_version}"
        return Namespace(self.name, path, toolchain.compiler_version, toolchain.target, toolchain.lnc)

    @staticmethod
    def names_for(namespace: Namespace, key: str) -> dict[str, str | None]:
        """The names (relative to the namespace) of entry ``key``'s files: its NEFF and
        manifest in the NEFF tree, its HLO and flags in the HLO tree. A kernel entry
        (``<K>/<K>``) has no HLO in neffcache's tree: the runtime recompiles its kernels."""
        at = shard(key)  # once: a scan asks this of every entry
        neff = at if namespace.path == "" else f"{_NEFF_TREE}/{at}"
        kernel = tn.is_kernel_key(key)
        return {
            "neff": f"{neff}{tn.NEFF}",
            "manifest": f"{neff}{tn.MANIFEST}",
            "hlo": None if kernel else f"{tn.HLO_TREE}/{at}{tn.HLO}",
            "flags": None if kernel else f"{tn.HLO_TREE}/{at}{tn.FLAGS}",
        }

    def locate(self, path: str) -> Located | None:
        match = tn.MANAGED_RE.match(path)
        if match:
            key = match.group("key")
            if match.group("a") + match.group("b") != key[:4] or match.group("suffix") not in tn.SHARDED_SUFFIXES:
                return None
            return self._managed(match, key, path)
        match = tn.KERNEL_MANAGED_RE.match(path)
        if match:
            if match.group("suffix") not in tn.NEFF_SUFFIXES:
                return None
            return self._managed(match, tn.kernel_key(match.group("k")), path)
        match = tn.BARE_RE.match(path)
        if match:
            key = match.group("key")
            if match.group("suffix") not in tn.NEFF_SUFFIXES or match.group("a") + match.group("b") != key[:4]:
                return None
            return Located(Namespace(self.name, "", None), key, shard(key), "", path)
        match = tn.KERNEL_BARE_RE.match(path)
        if match and match.group("suffix") in tn.NEFF_SUFFIXES:
            key = tn.kernel_key(match.group("k"))
            return Located(Namespace(self.name, "", None), key, key, "", path)
        return None

    def _managed(self, match: re.Match[str], key: str, path: str) -> Located:
        target, lnc = parse_target_dir(match)
        ns_path = match.group("ns")
        ns = Namespace(self.name, ns_path, match.group("ver"), target, lnc)
        return Located(ns, key, f"{ns_path}/{_NEFF_TREE}/{shard(key)}", ns_path, path[len(ns_path) + 1:])

    # An entry's files lie in two trees, at the same shard path in each (the module docstring).
    spread_trees = tn.TREES

    def directory_role(self, directory: str, namespaces: dict[str, Namespace | None] | None = None
                       ) -> DirectoryRole | None:
        """:meth:`Layout.directory_role`, from the last name first (every regex here ends in it):
        two lowercase hex digits, a shard (``<ns>/neff/ab/cd``, bare ``ab/cd``) or the level
        above shards (``<ns>/neff/ab``, bare ``ab``), never both (a shard's ``<d>/00`` is one level
        too deep for either form); 64 of them, a kernel's shard; ``neff`` or ``hlo``, perhaps a
        spread tree; any other name is nothing to this layout. The last name is read by slices
        (no split: a scan asks this of every directory)."""
        if directory[-2:] in _HEX_PAIRS and directory[-3:-2] in _NAME_START:
            shard = self._pair_shard(directory, namespaces)
            if shard is not None:
                # tuple.__new__ skips the NamedTuple's Python-level __new__: once per shard directory.
                return _new(DirectoryRole, (None, False, shard, None, None, None))
            below = self._shards_below(directory, namespaces)
            return None if below is None else DirectoryRole(shards_below=below)
        if len(directory) >= tn.KERNEL_KEY_LEN and directory[-tn.KERNEL_KEY_LEN - 1:-tn.KERNEL_KEY_LEN] in _NAME_START:
            shard = self._kernel_shard(directory, namespaces)
            return None if shard is None else DirectoryRole(shard=shard)
        if directory.endswith(_TREE_ENDS):
            match = tn.TREE_DIR_RE.match(directory)
            return None if match is None else DirectoryRole(spread_of=match.group("ns"))
        return None

    def _pair_shard(self, directory: str, namespaces: dict[str, Namespace | None] | None) -> ShardDir | None:
        """``directory`` as a shard directory, managed or bare, given that its last name is two
        lowercase hex digits (the callers check it): what locate() decides from a file's
        directory, decided once per directory by the same regexes up to the file name, so a
        file key_of() accepts is placed as locate() would. A managed shard's siblings share its
        answer: ``MANAGED_SHARD_RE`` ends in a last name of two hex digits and the end, so for
        such a last name it matches exactly when it matched a sibling's. ``namespaces`` keeps the
        answer by parent (under a key with a NUL, which no namespace path holds), so a scan runs
        the regex once per ``ab`` directory, not once per shard: 256 times fewer."""
        parent = "\0" + directory[:-3]
        cache = namespaces if directory[-3:-2] == "/" else None
        ns = cache.get(parent, _UNKNOWN) if cache is not None else _UNKNOWN
        if ns is _UNKNOWN:
            ns = self._managed_namespace(directory, namespaces)
            if cache is not None:
                cache[parent] = ns
        if ns is not None:
            a, b = directory[-5:-3], directory[-2:]
            return ShardDir(ns, ns.path, f"{ns.path}/{_NEFF_TREE}/{a}/{b}/", directory[len(ns.path) + 1:] + "/",
                            a + b, tn.SHARDED_SUFFIXES)
        match_bare = tn.BARE_SHARD_RE.match(directory)
        if match_bare is None:
            return None
        return ShardDir(self._bare(namespaces), "", directory + "/", directory + "/",
                        match_bare.group("a") + match_bare.group("b"), tn.NEFF_SUFFIXES)

    def _kernel_shard(self, directory: str, namespaces: dict[str, Namespace | None] | None) -> ShardDir | None:
        """A kernel's directory (``<K>/<K>.neff``), managed or bare, as :meth:`_pair_shard`."""
        match_kernel = tn.KERNEL_DIR_RE.match(directory)
        if match_kernel is None:
            return None
        digest = match_kernel.group("k")
        if match_kernel.group("ns") is None:
            return ShardDir(self._bare(namespaces), "", "", directory + "/", digest, tn.NEFF_SUFFIXES,
                            key_prefix=digest + "/")
        ns_path = match_kernel.group("ns")
        ns = self._namespace_of(match_kernel, namespaces)
        return ShardDir(ns, ns_path, f"{ns_path}/{_NEFF_TREE}/", directory[len(ns_path) + 1:] + "/", digest,
                        tn.NEFF_SUFFIXES, key_prefix=digest + "/")

    def _shards_below(self, directory: str, namespaces: dict[str, Namespace | None] | None) -> PlainFiles | None:
        """The ``shards_below`` of ``directory``: when ``<directory>/00`` is a shard directory, so
        is ``<directory>/<xy>`` for every pair of lowercase hex digits, with the same namespace,
        suffixes and name prefix, and the shard ``directory``'s last two digits plus ``xy``: both
        regexes (``MANAGED_SHARD_RE``, ``BARE_SHARD_RE``) end in a last name of two hex digits and
        the end, the argument ``_pair_shard`` caches by. So :meth:`plain_entries`' rule for
        those children is one rule: :meth:`ShardDir.key_of`'s names, NEFFs where ``_holds_neffs``
        says (tests/stores/test_count_plain.py holds the rule to ``shard`` of each child)."""
        shard = self._pair_shard(f"{directory}/00", namespaces)
        if shard is None:
            return None
        primary = frozenset((directory,)) if _holds_neffs(shard) else frozenset()
        return PlainFiles(_HEX_PAIRS, shard.shard[:2], tuple(sorted(shard.suffixes)), _NEFF_SUFFIX, primary,
                          ShardDir.KEY_MIN, ShardDir.KEY_MAX, shard.namespace)

    def _bare(self, namespaces: dict[str, Namespace | None] | None) -> Namespace:
        """The one namespace of a bare NEFF directory (unknown toolchain), shared by its entries."""
        bare = namespaces.get("") if namespaces is not None else None
        if bare is None:
            bare = Namespace(self.name, "", None)
            if namespaces is not None:
                namespaces[""] = bare
        return bare

    def _managed_namespace(self, directory: str, namespaces: dict[str, Namespace | None] | None
                           ) -> Namespace | None:
        """The namespace of ``directory`` when ``MANAGED_SHARD_RE`` matches it (one Namespace per
        path, kept in ``namespaces``), else None."""
        match = tn.MANAGED_SHARD_RE.match(directory)
        return None if match is None else self._namespace_of(match, namespaces)

    def _namespace_of(self, match: re.Match[str], namespaces: dict[str, Namespace | None] | None) -> Namespace:
        """The namespace a path regex's match names (its ``ns``, ``ver`` and target groups): one
        Namespace per path, kept in ``namespaces``, so a namespace's entries share it."""
        ns_path = match.group("ns")
        ns = namespaces.get(ns_path) if namespaces is not None else None
        if ns is None:
            target, lnc = parse_target_dir(match)
            ns = Namespace(self.name, ns_path, match.group("ver"), target, lnc)
            if namespaces is not None:
                namespaces[ns_path] = ns
        return ns

    def is_runtime_file(self, path: str) -> bool:
        return tn.is_temp_file(path)

    def claims_key(self, key: str) -> bool:
        # The runtime's 32-hex keys, its kernels' <K>/<K> and neffcache's own 64-hex ones.
        return tn.claims_key(key)

    def job_settings(self, flags: Sequence[str]) -> dict[str, str]:
        return tenv.job_settings(flags)

    def flags_beside(self, file_name: str) -> tuple[str, ...]:
        match = _HLO_NAME_RE.search(file_name)
        return (f"{match.group('key')}{tn.FLAGS}",) if match else ()

    def runtime_debris_after(self, path: str) -> float | None:
        return tn.TEMP_DEBRIS_AFTER if tn.is_temp_file(path) else None

    def prune_group_dir(self, entry_path: str) -> str | None:
        return tn.group_dir(entry_path)

    def parse_log_line(self, line: str) -> LogLine | None:
        match = _LOG_RE.search(line)
        if match is None:
            return None
        kind = "stored" if match.group("store") else _LOG_KINDS[match.group("hm")]
        return LogLine(kind, key=match.group("key"))

    def env_notes(self, root: str, namespace: Namespace) -> list[str]:
        return tenv.notes(posixpath.basename(namespace.path))

    def compile_only_env(self, environ: Mapping[str, str], *, retry_failed: bool,
                         toolchain: Toolchain | None = None, workers: int | None = None
                         ) -> tuple[dict[str, str | None], list[str]]:
        return tenv.compile_only(environ)

    def env_problems(self, environ: Mapping[str, str]) -> list[EnvProblem]:
        return tenv.problems(environ)

    def plan_entry(self, namespace: Namespace, key: str) -> EntryPlan:
        names = self.names_for(namespace, key)
        path = f"{namespace.path}/{_NEFF_TREE}/{shard(key)}" if namespace.path else shard(key)
        manifest, neff = names["manifest"], names["neff"]
        assert manifest is not None and neff is not None
        return EntryPlan(namespace, key, path, namespace.path, manifest, neff)

    def write_order(self, names: list[str], marker: str, manifest: str) -> list[str]:
        # Manifest first (a manifest without its NEFF reads as uncommitted), NEFF last: it commits.
        rank = {manifest: 0, marker: 9}
        return sorted(names, key=lambda n: (rank.get(n, 1), n))

    def private_env(self, scratch: str) -> dict[str, str]:
        # Its compile locks live in a local directory shared by every job of the host
        # (default /tmp/local_cache); a plan's recording compiles must not hold those.
        return {tenv.LOCAL_DIR_VAR: posixpath.join(scratch, "torchneuron-local")}

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
        neff_name, manifest_name = names["neff"], names["manifest"]
        assert neff_name is not None and manifest_name is not None
        neff = files.get(neff_name)
        committed = True
        if neff is None and manifest_name in files:
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
        return self.entry_at(located, files, state, problems, manifest, manifest_name=manifest_name,
                             marker_name=neff_name, committed=committed)

    def plain_entries(self, shards: Sequence[tuple[ShardDir, Sequence[str], Sequence[FileInfo]]]
                      ) -> tuple[int, int] | None:
        """:meth:`Layout.plain_entries`: what :meth:`classify` decides from the files alone,
        without a manifest or a problem, is SUCCESS exactly when the NEFF (``names_for``'s
        ``neff``) is present and not empty; every file of the entry counts in its size.

        Per shard, only the plain names (:meth:`ShardDir.key_of`) are taken: any other name
        declines the whole batch (``locate`` decides it). A key's NEFF is ``<key>.neff`` in
        the shard directory of the key's first four digits (every key ``key_of`` accepts here;
        a kernel's in its own directory) in the NEFF tree of a managed namespace, or in the
        bare directory itself (``names_for``): so whether a shard holds NEFFs is one answer for
        all its keys."""
        sizes: dict[str, int] = {}
        with_neff: set[str] = set()
        for shard, names, files in shards:
            key_of = shard.key_of
            holds_neffs = _holds_neffs(shard)
            # A NEFF is named <bare key>.neff, the key being the shard's key_prefix + the bare key.
            extra = len(_NEFF_SUFFIX) - len(shard.key_prefix)
            for name, info in zip(names, files, strict=True):
                key = key_of(name)
                if key is None:
                    return None
                size = info.size
                sizes[key] = sizes.get(key, 0) + size
                if holds_neffs and len(name) == len(key) + extra and name.endswith(_NEFF_SUFFIX):
                    if size == 0:
                        return None  # CORRUPT: the NEFF is empty
                    with_neff.add(key)
        if len(with_neff) != len(sizes):
            return None  # EMPTY, or uncommitted (a manifest without its NEFF)
        return len(sizes), sum(sizes.values())

    # -- what scan, load_entry and prune ask (issue #11) ---------------------------------------
    def locate_entry(self, path: str) -> Located | None:
        # An entry's path is its NEFF's without the suffix (``.../neff/ab/cd/<key>``, ``.../neff/<K>/<K>``).
        return self.locate(f"{path}.neff")


def _holds_neffs(shard: ShardDir) -> bool:
    """Whether the NEFFs of ``shard``'s entries lie in it (``names_for``'s ``neff``): a
    managed namespace's NEFF tree, or a bare NEFF directory."""
    return not shard.namespace.path or shard.name_dir.startswith(_NEFF_TREE + "/")

