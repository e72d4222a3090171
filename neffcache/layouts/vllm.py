"""Layout ``vllm``: vLLM-Neuron's compile cache, in both of its tiers.

::

    local tier   $VLLM_CACHE_ROOT/neuron/compile_cache/<hash>/     node-local (NVMe), file locks
    shared tier  $NEURON_LIBTORCH_REMOTE_CACHE/<hash>/             flat; filled by save_cache()

    <hash>/
        ...                      the compiled artifacts, nested directories too: vLLM's own,
                                 names not fixed here (#1368 shows graph_<hash>.neff, graph.hlo)
        .compilation_complete    written last: the commit marker
        neffcache.json           neffcache's manifest (entries it published or adopted)

Sources (docs/runtimes.md, "vLLM-Neuron"): the two tiers, the flat shared tier and the 32-hex
MD5 ``<hash>`` are the SDK's ``compilation_cache.md``; the marker's name and the file list come
from a user report (aws-neuron-sdk#1368), not the official pages.

Namespaces: neffcache manages ``<root>/<target>-lnc<N>/vllm-<version>/``. In a store (the
shared tier) an entry lies flat at ``<ns>/<hash>/``, where ``neffcache env`` points
``NEURON_LIBTORCH_REMOTE_CACHE``; a node-local tier neffcache manages keeps the runtime's
local form, ``<ns>/neuron/compile_cache/<hash>/`` (``VLLM_CACHE_ROOT`` = ``<local root>/<ns>``).
Roots vLLM filled on its own (``neuron/compile_cache/<hash>/`` or ``<hash>/`` at the root) are
read as one namespace of unknown toolchain (path ``""``). Both forms classify alike.

Which directory is a flat entry: exactly 32 lowercase hex digits (an MD5), and nothing else.
That claims no other layout's path: libneuronxla's ``neuronxcc-*``/``MODULE_*``, TorchNeuron's
bare shards (two hex digits) and kernel directories (64 hex), neffcache's ``.neffcache/``. The
local form keeps the looser names it always accepted (``neuron/compile_cache/`` is vLLM's alone).

Writers use the flat form (:meth:`VllmLayout.plan_entry`), so whatever neffcache copies into a
store (push, pull, promotion, warm) lands where the shared-tier reader looks; a key that cannot
be flat (not 32 hex) keeps the local form, the only one that can name it. The same entry in
the other form is the same entry (:meth:`VllmLayout.entry_paths`): a copy finds it present.

States: SUCCESS with the marker; without it, a directory with neffcache's manifest is an
interrupted publish (uncommitted: garbage after the grace period), one without is vLLM
compiling it now, or having died doing so: LOCKED, which prune leaves alone (vLLM's locks live
on the node, not in the entry: nothing here could be judged stale). CORRUPT: manifest
problems, or a marker with nothing beside it. Removal takes the marker first, so a
half-removed entry never reads as complete.

Rewarm: vLLM's entries carry no HLO and flags neffcache could recompile, nor a key it could
compute. Warm them by running the server compile-only (``neffcache warm``, :mod:`.vllm_env`).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.layouts import vllm_env
from neffcache.layouts.base import Layout
from neffcache.layouts.records import (
    TARGET_DIR_RE,
    DirectoryRole,
    EntryNames,
    EntryPlan,
    EnvProblem,
    Located,
    parse_target_dir,
)
from neffcache.manifest import MANIFEST_NAME, Manifest
from neffcache.toolchain import Toolchain

MARKER = ".compilation_complete"
CACHE_SUBDIR = "neuron/compile_cache"
_LOCAL_KEY = r"(?P<key>[0-9A-Za-z][0-9A-Za-z_.+-]*)"
_FLAT_KEY = r"(?P<key>[0-9a-f]{32})"
_NAME = r"(?P<name>[^/]+(?:/[^/]+)*)"
_NS = "(?P<ns>" + TARGET_DIR_RE + r"vllm-(?P<ver>[0-9][^/]*))/"
# ``\Z``, not ``$``: a directory named ``<hash>\n`` is no entry (``$`` matches before a newline).
_LOCAL_RE = re.compile("^" + _NS + CACHE_SUBDIR + "/" + _LOCAL_KEY + "/" + _NAME + r"\Z")
_LOCAL_BARE_RE = re.compile("^" + CACHE_SUBDIR + "/" + _LOCAL_KEY + "/" + _NAME + r"\Z")
_LOCAL_DIR_RE = re.compile("^" + _NS + CACHE_SUBDIR + "/" + _LOCAL_KEY + r"\Z")
_LOCAL_BARE_DIR_RE = re.compile("^" + CACHE_SUBDIR + "/" + _LOCAL_KEY + r"\Z")
_FLAT_RE = re.compile("^" + _NS + _FLAT_KEY + "/" + _NAME + r"\Z")
_FLAT_BARE_RE = re.compile("^" + _FLAT_KEY + "/" + _NAME + r"\Z")
_FLAT_DIR_RE = re.compile("^" + _NS + _FLAT_KEY + r"\Z")
_FLAT_BARE_DIR_RE = re.compile("^" + _FLAT_KEY + r"\Z")
_FLAT_KEY_RE = re.compile(_FLAT_KEY + r"\Z")
# (managed regex, bare regex) per form, the local form first: its names are the more specific.
_FILE_FORMS = ((_LOCAL_RE, _LOCAL_BARE_RE), (_FLAT_RE, _FLAT_BARE_RE))
_DIR_FORMS = ((_LOCAL_DIR_RE, _LOCAL_BARE_DIR_RE), (_FLAT_DIR_RE, _FLAT_BARE_DIR_RE))


def is_flat_key(key: str) -> bool:
    """Whether ``key`` can name a flat entry: 32 lowercase hex digits (vLLM's MD5)."""
    return _FLAT_KEY_RE.match(key) is not None


class VllmLayout(Layout):
    name = "vllm"
    runtime_dir = "vllm"
    needs_filesystem = True  # both tiers are directories (S3 only through FSx for Lustre)

    def names(self, namespace: Namespace, key: str) -> EntryNames:
        # No HLO, no flags file: nothing neffcache could recompile.
        return EntryNames(hlo=None, flags=None, neff=None, marker=MARKER, manifest=MANIFEST_NAME)

    def namespace_for(self, toolchain: Toolchain) -> Namespace:
        path = f"{toolchain.target_dir}/{self.version_dir(toolchain.compiler_version)}"
        return Namespace(self.name, path, toolchain.compiler_version, toolchain.target, toolchain.lnc)

    # -- the two forms of an entry's path ---------------------------------------------------------
    @staticmethod
    def flat_path(namespace: Namespace, key: str) -> str:
        """The shared tier's ``<ns>/<hash>``."""
        return posixpath.join(namespace.path, key) if namespace.path else key

    def runtime_local_path(self, namespace: Namespace, key: str) -> str | None:
        """The local tier's ``<ns>/neuron/compile_cache/<hash>`` (under a node-local root whose
        ``<ns>`` is ``VLLM_CACHE_ROOT``): where a prefetch into that tier puts the entry."""
        return posixpath.join(namespace.path, CACHE_SUBDIR, key) if namespace.path else f"{CACHE_SUBDIR}/{key}"

    has_other_forms = True

    def entry_paths(self, namespace: Namespace, key: str) -> tuple[str, ...]:
        local = self.runtime_local_path(namespace, key)
        assert local is not None
        return (self.flat_path(namespace, key), local) if is_flat_key(key) else (local,)

    def plan_entry(self, namespace: Namespace, key: str) -> EntryPlan:
        base = self.entry_paths(namespace, key)[0]
        return EntryPlan(namespace, key, base, base, MANIFEST_NAME, MARKER)

    def _namespace(self, match: re.Match[str]) -> Namespace:
        if "ns" in match.re.groupindex:  # a managed form
            target, lnc = parse_target_dir(match)
            return Namespace(self.name, match.group("ns"), match.group("ver"), target, lnc)
        return Namespace(self.name, "", None)

    def locate(self, path: str) -> Located | None:
        for managed, bare in _FILE_FORMS:
            match = managed.match(path) or bare.match(path)
            if match is None:
                continue
            name, key = match.group("name"), match.group("key")
            if any(part in (".", "..") for part in name.split("/")) or key in (".", ".."):
                return None
            base = path[: len(path) - len(name) - 1]
            return Located(self._namespace(match), key, base, base, name)
        return None

    # An entry is its <hash> directory: a scan resolves it once, and load_entry lists it whole
    # (nested artifacts too). Subdirectories match no directory regex, so their files reach the
    # entry through locate() with their nested names.
    entry_is_dir = True

    def directory_role(self, directory: str, namespaces: dict[str, Namespace | None] | None = None
                       ) -> DirectoryRole | None:
        # A scan asks this of every directory: the local form needs its subdirectory, the flat
        # form a last name of 32 characters.
        local = CACHE_SUBDIR in directory
        if not local and len(directory) - directory.rfind("/") - 1 != 32:
            return None
        managed, bare = _DIR_FORMS[0] if local else _DIR_FORMS[1]
        match = managed.match(directory) or bare.match(directory)
        if match is None or match.group("key") in (".", ".."):
            return None
        # Not flat: nested files are the entry's too (they reach it through locate()).
        return DirectoryRole(Located(self._namespace(match), match.group("key"), directory, directory, ""))

    def locate_entry(self, path: str) -> Located | None:
        return self.locate(f"{path}/{MARKER}")

    # -- what jobs and warm-ups need (facts in vllm_env) -------------------------------------------
    def job_env(self, root: str, namespace: Namespace) -> dict[str, str]:
        return {vllm_env.REMOTE_VAR: posixpath.join(root, namespace.path) if namespace.path else root}

    def node_local_env(self, local_root: str, namespace: Namespace) -> dict[str, str]:
        return {vllm_env.ROOT_VAR: posixpath.join(local_root, namespace.path) if namespace.path else local_root}

    def env_notes(self, root: str, namespace: Namespace) -> list[str]:
        return vllm_env.env_notes(posixpath.basename(namespace.path))

    def filesystem_note(self) -> str:
        return vllm_env.FILESYSTEM_NOTE

    def env_problems(self, environ: Mapping[str, str]) -> list[EnvProblem]:
        return vllm_env.env_problems(environ)

    def compile_only_env(self, environ: Mapping[str, str], *, retry_failed: bool,
                         toolchain: Toolchain | None = None, workers: int | None = None
                         ) -> tuple[dict[str, str | None], list[str]]:
        return vllm_env.compile_only_env(environ, toolchain=toolchain, workers=workers)

    def is_ready_line(self, line: str) -> bool:
        return vllm_env.is_ready_line(line)

    # -- writing, removing, judging ---------------------------------------------------------------
    def write_order(self, names: list[str], marker: str, manifest: str) -> list[str]:
        # The manifest first (from then on the directory reads as uncommitted, never as a
        # compile in progress), the marker strictly last: it commits.
        rank = {manifest: 0, marker: 9}
        return sorted(names, key=lambda n: (rank.get(n, 1), n))

    def payload_names(self, entry: Entry) -> frozenset[str]:
        # vLLM's artifacts are not named by any official fact: the manifest covers every one.
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
