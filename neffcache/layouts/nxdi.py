"""Layout ``nxdi``: NxD Inference compiled models, the artifact inference fleets actually ship.

::

    <root>/<target>-lnc<N>/nxdi-<version>/<config hash>/    managed by neffcache
    <root>/neuron-compiled-artifacts/<config hash>/         NxDI's default under a model directory
    <root>/                                                 NEURON_COMPILED_ARTIFACTS itself

    <entry>/
        model.pt                 the traced model NxDI loads (its NEFFs inside)
        neuron_config.json       the configuration; its md5 names the directory
        weights/...              sharded weights (tp<N>_sharded_checkpoint.safetensors), optional
        neffcache.json           neffcache's manifest (entries it published or adopted)
        neffcache.done           neffcache's commit marker, written strictly last

Sources (docs/runtimes.md, "nxdi"): NxDI ``compile()`` writes ``model.pt`` and
``neuron_config.json`` (plus sharded weights) into ``NEURON_COMPILED_ARTIFACTS`` or
``<model>/neuron-compiled-artifacts/<md5 of the config JSON>/``; older vLLM-Neuron (0.x)
deletes that directory before it compiles. That the md5 is of ``neuron_config.json``'s bytes
is neffcache's reading, unverified: a directory whose name is not that md5 is reported, never
loaded as another configuration's model (:meth:`NxdiLayout.key_from_content`).

**What makes a runtime-written directory an entry.** NxDI writes no commit marker, and writes
for minutes (the configuration first, then ``model.pt``, then the weights, with the checkpoint
loaded in between). A directory without neffcache's files is an entry (SUCCESS) once it holds
``model.pt`` and ``neuron_config.json`` and none of its files changed for
:data:`SETTLE_SECONDS`; before that it is a compile in progress (LOCKED: kept by every prune,
never copied, never pushed by the write-back); settled without one of the two it is CORRUPT
(a compile that died). neffcache's own writes need no such wait: the manifest first (from then
on the directory reads as an uncommitted publish, garbage after the grace period), the
weights, the configuration, ``model.pt`` (what NxDI loads, so a reader pointed at a half copy
fails to load rather than loads half), and :data:`MARKER` strictly last: it commits.

Keys: the config hash, 32 lowercase hex digits, in the managed and bare forms; a root holding
the files (``NEURON_COMPILED_ARTIFACTS``) names none, so its key is empty until a copy reads
it from the configuration (:meth:`NxdiLayout.key_from_content`) and lands it at
``neuron-compiled-artifacts/<hash>/``. Bare and root forms are one namespace of unknown
toolchain (path ``""``); the managed form carries the toolchain, so prefetch and prune by
compiler reach it. Removal takes the marker and ``model.pt`` first: a half-removed entry never
loads.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import time
from collections.abc import Callable, Mapping

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.layouts.base import Layout
from neffcache.layouts.records import TARGET_DIR_RE, DirectoryRole, EntryNames, EntryPlan, Located, parse_target_dir
from neffcache.manifest import MANIFEST_NAME, Manifest
from neffcache.toolchain import Toolchain

MODEL = "model.pt"
CONFIG = "neuron_config.json"
WEIGHTS = "weights"
MARKER = "neffcache.done"  # neffcache's own: NxDI writes no commit marker
ARTIFACTS_DIR = "neuron-compiled-artifacts"
ARTIFACTS_VAR = "NEURON_COMPILED_ARTIFACTS"
WORK_DIR_VAR = "BASE_COMPILE_WORK_DIR"  # NxDI's compile work directory (default /tmp/nxd_model/)
# Seconds a runtime-written directory must stay unchanged to be an entry (the module docstring).
SETTLE_SECONDS = 600.0

_KEY = r"(?P<key>[0-9a-f]{32})"
_NAME = r"(?P<name>[^/]+(?:/[^/]+)*)"
_NS = "(?P<ns>" + TARGET_DIR_RE + r"nxdi-(?P<ver>[0-9][^/]*))/"
# ``\Z``, not ``$``: a directory named ``<hash>\n`` is no entry.
_MANAGED_RE = re.compile("^" + _NS + _KEY + "/" + _NAME + r"\Z")
_BARE_RE = re.compile("^" + ARTIFACTS_DIR + "/" + _KEY + "/" + _NAME + r"\Z")
_MANAGED_DIR_RE = re.compile("^" + _NS + _KEY + r"\Z")
_BARE_DIR_RE = re.compile("^" + ARTIFACTS_DIR + "/" + _KEY + r"\Z")
# The root form claims only the names NxDI writes there: anything else at a root stays foreign.
_ROOT_RE = re.compile(r"^(?P<name>model\.pt|neuron_config\.json|weights/[^/]+(?:/[^/]+)*)\Z")


def config_hash(data: bytes) -> str:
    """The name NxDI gives the directory of a configuration whose JSON is ``data``."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class NxdiLayout(Layout):
    name = "nxdi"
    runtime_dir = "nxdi"
    needs_filesystem = True  # NxDI loads a local directory

    def names(self, namespace: Namespace, key: str) -> EntryNames:
        # No HLO or flags neffcache could recompile from: rewarm has nothing to do here.
        return EntryNames(hlo=None, flags=None, neff=None, marker=MARKER, manifest=MANIFEST_NAME)

    def namespace_for(self, toolchain: Toolchain) -> Namespace:
        path = f"{toolchain.target_dir}/{self.version_dir(toolchain.compiler_version)}"
        return Namespace(self.name, path, toolchain.compiler_version, toolchain.target, toolchain.lnc)

    def plan_entry(self, namespace: Namespace, key: str) -> EntryPlan:
        if not key:  # the root form: the root itself
            return EntryPlan(namespace, key, "", "", MANIFEST_NAME, MARKER)
        base = posixpath.join(namespace.path, key) if namespace.path else f"{ARTIFACTS_DIR}/{key}"
        return EntryPlan(namespace, key, base, base, MANIFEST_NAME, MARKER)

    def _namespace(self, match: re.Match[str]) -> Namespace:
        if "ns" in match.re.groupindex:
            target, lnc = parse_target_dir(match)
            return Namespace(self.name, match.group("ns"), match.group("ver"), target, lnc)
        return Namespace(self.name, "", None)

    def locate(self, path: str) -> Located | None:
        match = _MANAGED_RE.match(path) or _BARE_RE.match(path)
        if match is not None:
            name = match.group("name")
            if any(part in (".", "..") for part in name.split("/")):
                return None
            base = path[: len(path) - len(name) - 1]
            return Located(self._namespace(match), match.group("key"), base, base, name)
        root = _ROOT_RE.match(path)
        if root is None or any(part in (".", "..") for part in path.split("/")):
            return None
        return Located(Namespace(self.name, "", None), "", "", "", path)

    # The managed and bare forms are one directory each: a scan resolves it once, and its nested
    # weights reach the entry through locate(). The root form is never a directory match (every
    # store has a root): its files are placed one by one.
    entry_is_dir = True

    def directory_role(self, directory: str, namespaces: dict[str, Namespace | None] | None = None
                       ) -> DirectoryRole | None:
        if len(directory) - directory.rfind("/") - 1 != 32:
            return None
        match = _MANAGED_DIR_RE.match(directory) or _BARE_DIR_RE.match(directory)
        if match is None:
            return None
        # Not flat: nested files are the entry's too (they reach it through locate()).
        return DirectoryRole(Located(self._namespace(match), match.group("key"), directory, directory, ""))

    def locate_entry(self, path: str) -> Located | None:
        return self.locate(f"{path}/{MODEL}" if path else MODEL)

    def key_from_content(self, key: str, read: Callable[[str], bytes]) -> str:
        """The config hash of the entry's own ``neuron_config.json``: the key a copy of a root
        form lands under; for a named form, its name, or ValueError when the name is another
        configuration's (NxDI would load that directory as the model of its name's config)."""
        actual = config_hash(read(CONFIG))
        if key and key != actual:
            raise ValueError(f"{CONFIG} has md5 {actual}: the directory {key} names another configuration")
        return actual

    # -- what jobs need ----------------------------------------------------------------------------
    def job_env(self, root: str, namespace: Namespace) -> dict[str, str]:
        # NxDI loads the one directory NEURON_COMPILED_ARTIFACTS names, a model's config hash
        # below the namespace: neffcache cannot name it without the model's configuration.
        return {}

    def env_notes(self, root: str, namespace: Namespace) -> list[str]:
        where = posixpath.join(root, namespace.path) if namespace.path else root
        return [f"NxD Inference loads the directory {ARTIFACTS_VAR} names: point it at {where}/<config hash> "
                f"(the md5 of the model's {CONFIG}; `neffcache scan --entries` lists them)"]

    # -- writing, removing, judging ---------------------------------------------------------------
    def write_order(self, names: list[str], marker: str, manifest: str) -> list[str]:
        # Manifest first (the directory reads as an uncommitted publish), model.pt last of the data
        # (what NxDI loads: a half copy fails to load), the marker strictly last.
        rank = {manifest: 0, CONFIG: 2, MODEL: 3, marker: 9}
        return sorted(names, key=lambda n: (rank.get(n, 1), n))

    def payload_names(self, entry: Entry) -> frozenset[str]:
        return frozenset(self.transferable_names(entry))

    def removal_phases(self, entry: Entry) -> list[list[str]]:
        # The marker and model.pt first: what is left never loads, and reads as uncommitted (our
        # manifest, last) or as an incomplete compile (a runtime's), never as another entry.
        names = set(entry.files)
        first = [n for n in (MARKER, MODEL) if n in names]
        manifest = [MANIFEST_NAME] if MANIFEST_NAME in names else []
        rest = sorted(names - {MARKER, MODEL, MANIFEST_NAME})
        return [phase for phase in (first, rest, manifest) if phase]

    def classify(
        self, located: Located, files: Mapping[str, FileInfo], manifest: Manifest | None,
        manifest_error: str | None = None,
    ) -> Entry:
        problems: list[str] = [manifest_error] if manifest_error else []
        if manifest is not None:
            problems.extend(self.manifest_problems(files, manifest, located))
        missing = [n for n in (MODEL, CONFIG) if n not in files]
        committed = True
        if MARKER in files:
            if MANIFEST_NAME not in files:
                problems.append(f"{MARKER} without {MANIFEST_NAME}")
            problems.extend(f"no {n}" for n in missing)
            state = EntryState.CORRUPT if problems else EntryState.SUCCESS
        elif MANIFEST_NAME in files:
            state, committed = EntryState.CORRUPT, False
            problems.append(f"uncommitted: no {MARKER} (an interrupted or ongoing write)")
        else:
            state = self._runtime_state(files, missing, problems)
        return self.entry_at(located, files, state, problems, manifest, manifest_name=MANIFEST_NAME,
                             marker_name=MARKER, committed=committed)

    @staticmethod
    def _runtime_state(files: Mapping[str, FileInfo], missing: list[str], problems: list[str]) -> EntryState:
        """A directory NxDI wrote (no manifest, no marker): settled or not (the module docstring)."""
        age = time.time() - max((f.mtime for f in files.values()), default=0.0)
        if age < SETTLE_SECONDS:
            problems.append(f"written {max(age, 0.0):.0f}s ago: an NxDI compile in progress until nothing "
                            f"changes for {SETTLE_SECONDS:.0f}s (kept)")
            return EntryState.LOCKED
        if missing:
            problems.append(f"incomplete: no {' and no '.join(missing)} (a compile that died?)")
            return EntryState.CORRUPT
        return EntryState.SUCCESS
