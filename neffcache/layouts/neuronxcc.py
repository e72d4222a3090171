"""Layout A: libneuronxla's cache (torch-xla, NxD, optimum-neuron, neuron_parallel_compile).

::

    <root>/[<target>-lnc<N>/]neuronxcc-<version>/MODULE_<graph>+<flags>/
        model.hlo_module.pb   compile_flags.json (2.12/2.13: compile_flags.txt)
        model.neff            model.done (2.15+, written after the neff: the commit marker)
        model.log             failure text        model.hlo_module.pb.lock  while compiling

The runtime puts ``neuronxcc-<version>/`` under whatever root it is given; neffcache hands it
``<root>/<target>-lnc<N>`` so NEFFs of different targets never share a directory (the target
is in neither the path nor the flags hash the runtime computes).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.instances import TARGETS
from neffcache.layouts.base import TARGET_DIR_RE, EntryNames, EntryPlan, Layout, Located, parse_target_dir
from neffcache.manifest import MANIFEST_NAME, Manifest
from neffcache.toolchain import Toolchain

HLO = "model.hlo_module.pb"
FLAGS_JSON = "compile_flags.json"
FLAGS_TXT = "compile_flags.txt"
NEFF = "model.neff"
DONE = "model.done"
LOG = "model.log"
LOCK_SUFFIX = ".lock"
KNOWN = frozenset({HLO, FLAGS_JSON, FLAGS_TXT, NEFF, DONE, LOG, MANIFEST_NAME})

_PATH_RE = re.compile(
    "^" + TARGET_DIR_RE + r"neuronxcc-(?P<ver>[0-9][^/]*)/(?P<key>MODULE_[^/]+)/(?P<name>[^/]+)$"
)
_NS_DIR_RE = re.compile("^" + TARGET_DIR_RE + r"neuronxcc-(?P<ver>[0-9][^/]*)$")
KEY_PREFIX = "MODULE_"
# libneuronxla's root lock, at the root or under a target directory neffcache added.
_ROOT_LOCK_RE = re.compile(r"^(?:(?:" + "|".join(TARGETS) + r")-lnc[12]/)?lock$")


class NeuronxccLayout(Layout):
    name = "neuronxcc"
    runtime_dir = "neuronxcc"

    def names(self, namespace: Namespace, key: str) -> EntryNames:
        return EntryNames(hlo=HLO, flags=FLAGS_JSON, neff=NEFF, marker=DONE, manifest=MANIFEST_NAME,
                          failure_log=LOG, runtime_lock=HLO + LOCK_SUFFIX)

    def flags_of(self, entry: Entry) -> str | None:
        return next((n for n in (FLAGS_JSON, FLAGS_TXT) if n in entry.files), None)

    def locks_of(self, entry: Entry) -> tuple[str, ...]:
        return tuple(sorted(n for n in entry.files if n.endswith(LOCK_SUFFIX)))

    def payload_names(self, entry: Entry) -> frozenset[str]:
        return frozenset({NEFF, entry.marker_name})

    def state_anchor(self, entry: Entry) -> str | None:
        # A NEFF without model.done is uncommitted; a legacy entry's NEFF is its marker; else
        # the failure log makes it FAILED, else the HLO makes it EMPTY.
        return next((n for n in (NEFF, LOG, HLO) if n in entry.files), None)

    def is_runtime_file(self, path: str) -> bool:
        return _ROOT_LOCK_RE.match(path) is not None

    def namespace_for(self, toolchain: Toolchain) -> Namespace:
        path = f"{toolchain.target_dir}/neuronxcc-{toolchain.compiler_version}"
        return Namespace(self.name, path, toolchain.compiler_version, toolchain.target, toolchain.lnc)

    def namespace_dir(self, directory: str) -> Namespace | None:
        """The namespace whose directory is ``directory``, or None."""
        match = _NS_DIR_RE.match(directory)
        if not match:
            return None
        target, lnc = parse_target_dir(match)
        return Namespace(self.name, directory, match.group("ver"), target, lnc)

    def locate_dir(self, directory: str, namespaces: dict[str, Namespace | None] | None = None
                   ) -> Located | None:
        """The entry whose directory is ``directory`` (name left empty).

        ``namespaces`` caches :meth:`namespace_dir` by directory across calls: a scan then runs
        one regex per namespace, not one per entry, and its entries share one Namespace.
        """
        parent, _, key = directory.rpartition("/")
        if not key.startswith(KEY_PREFIX) or len(key) == len(KEY_PREFIX):
            return None
        if namespaces is None:
            ns = self.namespace_dir(parent)
        elif parent in namespaces:
            ns = namespaces[parent]
        else:
            ns = namespaces[parent] = self.namespace_dir(parent)
        if ns is None:
            return None
        return Located(ns, key, directory, directory, "")

    def locate(self, path: str) -> Located | None:
        match = _PATH_RE.match(path)
        if not match:
            return None
        target, lnc = parse_target_dir(match)
        ver = match.group("ver")
        ns_path = posixpath.dirname(posixpath.dirname(path))
        ns = Namespace(self.name, ns_path, ver, target, lnc)
        base = posixpath.join(ns_path, match.group("key"))
        return Located(ns, match.group("key"), base, base, match.group("name"))

    def plan_entry(self, namespace: Namespace, key: str) -> EntryPlan:
        base = posixpath.join(namespace.path, key) if namespace.path else key
        return EntryPlan(namespace, key, base, base, MANIFEST_NAME, DONE)

    def write_order(self, names: list[str], marker: str, manifest: str) -> list[str]:
        # The manifest first: from then on the directory reads as "uncommitted" (never as an
        # EMPTY entry a runtime would pick up) until the marker, strictly last, commits it.
        rank = {manifest: 0, HLO: 1, FLAGS_JSON: 2, FLAGS_TXT: 2, NEFF: 3, LOG: 3, marker: 9}
        return sorted(names, key=lambda n: (rank.get(n, 2), n))

    def job_env(self, root: str, namespace: Namespace) -> dict[str, str]:
        # The runtime appends neuronxcc-<version> itself: hand it the directory above.
        parent = posixpath.dirname(namespace.path)
        url = posixpath.join(root, parent) if parent else root
        return {"NEURON_COMPILE_CACHE_URL": url}

    def classify(
        self, located: Located, files: Mapping[str, FileInfo], manifest: Manifest | None,
        manifest_error: str | None = None,
    ) -> Entry:
        names = files.keys()
        problems: list[str] = []
        committed = True
        if names <= KNOWN:  # the common case, and a set test instead of two loops per entry
            extra: tuple[str, ...] = ()
            locks: list[str] = []
        else:
            extra = tuple(sorted(n for n in names if n not in KNOWN and not n.endswith(LOCK_SUFFIX)))
            locks = [n for n in names if n.endswith(LOCK_SUFFIX)]
        legacy = FLAGS_TXT in names and FLAGS_JSON not in names and DONE not in names
        marker = NEFF if legacy else DONE
        neff = files.get(NEFF)

        if manifest_error:
            problems.append(manifest_error)
        if manifest is not None:
            problems.extend(self.manifest_problems(files, manifest, located))

        if locks:
            state = EntryState.LOCKED
        elif problems and marker in names:
            state = EntryState.CORRUPT
        elif neff is not None and marker in names:
            state = EntryState.SUCCESS
            if neff.size == 0:
                state, problems = EntryState.CORRUPT, [*problems, "model.neff is empty"]
        elif neff is not None or MANIFEST_NAME in names:
            state, committed = EntryState.CORRUPT, False
            problems.append("uncommitted: no model.done (an interrupted or ongoing write)")
        elif DONE in names:
            state = EntryState.CORRUPT
            problems.append("model.done without model.neff")
        elif LOG in names:
            state = EntryState.FAILED
        elif HLO in names:
            state = EntryState.EMPTY
        else:
            state = EntryState.CORRUPT
            problems.append("no HLO, NEFF or log")
        if state is EntryState.SUCCESS and HLO not in names:
            problems.append("no model.hlo_module.pb: the entry serves but cannot be recompiled")
        return Entry(
            namespace=located.namespace,
            key=located.key,
            path=located.path,
            base=located.base,
            files=dict(files),
            state=state,
            problems=tuple(problems),
            manifest=manifest,
            manifest_name=MANIFEST_NAME,
            marker_name=marker,
            extra=extra,
            committed=committed,
        )
