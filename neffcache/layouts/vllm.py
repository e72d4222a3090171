"""Layout C: vLLM-Neuron's compile cache (the vLLM Neuron plugin).

::

    $VLLM_CACHE_ROOT/neuron/compile_cache/<hash>/
        ...                      the compiled artifacts, in nested directories too (NEFFs, the
                                 traced model, its config): vLLM's own, names not fixed here
        .compilation_complete    written last: the commit marker
        neffcache.json           neffcache's manifest (entries it published or adopted)

Namespaces (docs/runtimes.md, "Layout C"): neffcache manages ``<root>/<target>-lnc<N>/vllm-<version>/``
and hands vLLM that directory as ``VLLM_CACHE_ROOT`` (``neffcache env``), so an entry lives at
``<target>-lnc<N>/vllm-<version>/neuron/compile_cache/<hash>/``. Whether vLLM's ``<hash>``
covers the compiler version is not known: like layout B, neffcache versions the directory. A
``VLLM_CACHE_ROOT`` vLLM filled on its own (``neuron/compile_cache/<hash>/`` at the store root)
is read as one namespace of unknown toolchain (path ``""``), as layout B reads a bare NEFF dir.
Whatever else vLLM keeps under ``VLLM_CACHE_ROOT`` (its torch.compile cache, say) is not an
entry of this layout: foreign files, never neffcache's to delete.

States: SUCCESS with the marker; without it, a directory with neffcache's manifest is an
interrupted publish (uncommitted: garbage after the grace period), one without is vLLM
compiling it now, or having died doing so: LOCKED, which prune leaves alone (vLLM keeps no lock
file neffcache could judge stale; a rerun of vLLM compiles it again). CORRUPT: manifest
problems, or a marker with nothing beside it. Removal takes the marker first, so a
half-removed entry never reads as complete.

Rewarm: vLLM's entries carry no HLO and flags neffcache could recompile, nor a key it could
compute: ``rewarm`` cannot rebuild them. Warm a new toolchain by running vLLM (compile-only) with
``VLLM_CACHE_ROOT`` from ``neffcache env``. vLLM's log lines are not known: none are parsed.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.layouts.base import Layout
from neffcache.layouts.records import TARGET_DIR_RE, EntryNames, EntryPlan, Located, parse_target_dir
from neffcache.manifest import MANIFEST_NAME, Manifest
from neffcache.toolchain import Toolchain

MARKER = ".compilation_complete"
CACHE_SUBDIR = "neuron/compile_cache"
ROOT_VAR = "VLLM_CACHE_ROOT"
_HASH = r"(?P<key>[0-9A-Za-z][0-9A-Za-z_.+-]*)"
_NAME = r"(?P<name>[^/]+(?:/[^/]+)*)"
_MANAGED_RE = re.compile(
    "^(?P<ns>" + TARGET_DIR_RE + r"vllm-(?P<ver>[0-9][^/]*))/" + CACHE_SUBDIR + "/" + _HASH + "/" + _NAME + "$"
)
_BARE_RE = re.compile("^" + CACHE_SUBDIR + "/" + _HASH + "/" + _NAME + "$")
_MANAGED_DIR_RE = re.compile(
    "^(?P<ns>" + TARGET_DIR_RE + r"vllm-(?P<ver>[0-9][^/]*))/" + CACHE_SUBDIR + "/" + _HASH + "$"
)
_BARE_DIR_RE = re.compile("^" + CACHE_SUBDIR + "/" + _HASH + "$")


class VllmLayout(Layout):
    name = "vllm"
    runtime_dir = "vllm"
    needs_filesystem = True  # VLLM_CACHE_ROOT is a directory (a shared volume across pods)

    def names(self, namespace: Namespace, key: str) -> EntryNames:
        # No HLO, no flags file: nothing neffcache could recompile.
        return EntryNames(hlo=None, flags=None, neff=None, marker=MARKER, manifest=MANIFEST_NAME)

    def namespace_for(self, toolchain: Toolchain) -> Namespace:
        path = f"{toolchain.target_dir}/{self.version_dir(toolchain.compiler_version)}"
        return Namespace(self.name, path, toolchain.compiler_version, toolchain.target, toolchain.lnc)

    def entry_base(self, namespace: Namespace, key: str) -> str:
        return posixpath.join(namespace.path, CACHE_SUBDIR, key) if namespace.path else f"{CACHE_SUBDIR}/{key}"

    def locate(self, path: str) -> Located | None:
        match = _MANAGED_RE.match(path)
        if match is not None:
            target, lnc = parse_target_dir(match)
            ns = Namespace(self.name, match.group("ns"), match.group("ver"), target, lnc)
        else:
            match = _BARE_RE.match(path)
            if match is None:
                return None
            ns = Namespace(self.name, "", None)
        name = match.group("name")
        if any(part in (".", "..") for part in name.split("/")):
            return None
        base = self.entry_base(ns, match.group("key"))
        return Located(ns, match.group("key"), base, base, name)

    # An entry is its <hash> directory: a scan resolves it once, and load_entry lists it whole
    # (nested artifacts too). Subdirectories match neither regex, so their files reach the
    # entry through locate() with their nested names.
    entry_is_dir = True

    def locate_dir(self, directory: str, namespaces: dict[str, Namespace | None] | None = None
                   ) -> Located | None:
        if CACHE_SUBDIR not in directory:  # both regexes need it: a scan asks this of every directory
            return None
        match = _MANAGED_DIR_RE.match(directory)
        if match is not None:
            target, lnc = parse_target_dir(match)
            ns = Namespace(self.name, match.group("ns"), match.group("ver"), target, lnc)
        else:
            match = _BARE_DIR_RE.match(directory)
            if match is None:
                return None
            ns = Namespace(self.name, "", None)
        key = match.group("key")
        if key in (".", ".."):
            return None
        return Located(ns, key, directory, directory, "")

    def locate_entry(self, path: str) -> Located | None:
        return self.locate(f"{path}/{MARKER}")

    def plan_entry(self, namespace: Namespace, key: str) -> EntryPlan:
        base = self.entry_base(namespace, key)
        return EntryPlan(namespace, key, base, base, MANIFEST_NAME, MARKER)

    def job_env(self, root: str, namespace: Namespace) -> dict[str, str]:
        return {ROOT_VAR: posixpath.join(root, namespace.path) if namespace.path else root}

    def env_notes(self, root: str, namespace: Namespace) -> list[str]:
        return [f"vLLM-Neuron compiles into ${ROOT_VAR}/{CACHE_SUBDIR}/<hash>/; its hash may not carry the "
                f"compiler version: neffcache versions the directory ({posixpath.basename(namespace.path)}/). "
                "rewarm cannot rebuild vLLM entries: warm them by running vLLM with this environment"]

    def write_order(self, names: list[str], marker: str, manifest: str) -> list[str]:
        # The manifest first (from then on the directory reads as uncommitted, never as a
        # compile in progress), the marker strictly last: it commits.
        rank = {manifest: 0, marker: 9}
        return sorted(names, key=lambda n: (rank.get(n, 1), n))

    def payload_names(self, entry: Entry) -> frozenset[str]:
        # vLLM's artifacts are not named by any known fact: the manifest covers every one.
        return frozenset(self.transferable_names(entry))

    def removal_phases(self, entry: Entry) -> list[list[str]]:
        names = set(entry.files)
        marker = [MARKER] if MARKER in names else []
        manifest = [MANIFEST_NAME] if MANIFEST_NAME in names else []
        rest = sorted(names - {MARKER, MANIFEST_NAME})
        return [phase for phase in (marker, rest, manifest) if phase]

    def classify(
        self, located: Located, files: Mapping[str, FileInfo], manifest: Manifest | None,
        manifest_error: str | None = None,
    ) -> Entry:
        problems: list[str] = []
        if manifest_error:
            problems.append(manifest_error)
        if manifest is not None:
            problems.extend(self.manifest_problems(files, manifest, located))
        committed = True
        artifacts = set(files) - {MARKER, MANIFEST_NAME}
        if MARKER in files:
            if not artifacts:
                problems.append(f"{MARKER} without any compiled artifact")
            state = EntryState.CORRUPT if problems else EntryState.SUCCESS
        elif MANIFEST_NAME in files:
            state, committed = EntryState.CORRUPT, False
            problems.append(f"uncommitted: no {MARKER} (an interrupted or ongoing write)")
        else:
            state = EntryState.LOCKED
            problems.append(f"no {MARKER}: vLLM is compiling it, or died doing so (kept)")
        return self.entry_at(located, files, state, problems, manifest, manifest_name=MANIFEST_NAME,
                             marker_name=MARKER, committed=committed)
