"""Layout B: TorchNeuron's native NEFF cache (``torch.compile(backend="neuron")``).

::

    <root>/[<target>-lnc<N>/]torchneuron-<version>/
        neff/<k0k1>/<k2k3>/<key>.neff            TORCH_NEURONX_NEFF_CACHE_DIR: the commit marker
        neff/<k0k1>/<k2k3>/<key>.neffcache.json  neffcache's manifest, beside the NEFF
        hlo/<k0k1>/<k2k3>/<key>.hlo              TORCH_NEURONX_HLO_CACHE_DIR: the HLO, to recompile
        hlo/<k0k1>/<k2k3>/<key>.flags.json

The runtime's own key may not include the compiler version, so neffcache versions the
directory itself. A bare NEFF directory a job filled directly (``ab/cd/<key>.neff`` at the
root) is read as one namespace of unknown toolchain.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.layouts.base import TARGET_DIR_RE, EntryNames, EntryPlan, Layout, Located, parse_target_dir
from neffcache.manifest import Manifest
from neffcache.toolchain import Toolchain

_SUFFIXES = (".neffcache.json", ".flags.json", ".neff", ".hlo")
_MANAGED_RE = re.compile(
    "^" + TARGET_DIR_RE + r"torchneuron-(?P<ver>[0-9][^/]*)/(?P<kind>neff|hlo)/"
    r"(?P<a>[0-9a-f]{2})/(?P<b>[0-9a-f]{2})/(?P<key>[0-9a-f]{64})(?P<suffix>\.[a-z.]+)$"
)
_BARE_RE = re.compile(r"^(?P<a>[0-9a-f]{2})/(?P<b>[0-9a-f]{2})/(?P<key>[0-9a-f]{64})(?P<suffix>\.[a-z.]+)$")


def shard(key: str) -> str:
    return f"{key[0:2]}/{key[2:4]}/{key}"


class TorchNeuronLayout(Layout):
    name = "torchneuron"
    runtime_dir = "torchneuron"

    def names(self, namespace: Namespace, key: str) -> EntryNames:
        names = self.names_for(namespace, key)
        return EntryNames(hlo=names["hlo"], flags=names["flags"], neff=names["neff"], marker=names["neff"],
                          manifest=names["manifest"])

    def namespace_for(self, toolchain: Toolchain) -> Namespace:
        path = f"{toolchain.target_dir}/torchneuron-{toolchain.compiler_version}"
        return Namespace(self.name, path, toolchain.compiler_version, toolchain.target, toolchain.lnc)

    @staticmethod
    def names_for(namespace: Namespace, key: str) -> dict[str, str]:
        bare = namespace.path == ""
        neff_dir = "" if bare else "neff/"
        return {
            "neff": f"{neff_dir}{shard(key)}.neff",
            "manifest": f"{neff_dir}{shard(key)}.neffcache.json",
            "hlo": f"hlo/{shard(key)}.hlo",
            "flags": f"hlo/{shard(key)}.flags.json",
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

    def plan_entry(self, namespace: Namespace, key: str) -> EntryPlan:
        names = self.names_for(namespace, key)
        path = posixpath.join(namespace.path, "neff", shard(key)) if namespace.path else shard(key)
        return EntryPlan(namespace, key, path, namespace.path, names["manifest"], names["neff"])

    def write_order(self, names: list[str], marker: str, manifest: str) -> list[str]:
        # Manifest first (a manifest without its NEFF reads as uncommitted), NEFF last: it commits.
        rank = {manifest: 0, marker: 9}
        return sorted(names, key=lambda n: (rank.get(n, 1), n))

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
        return Entry(
            namespace=located.namespace,
            key=located.key,
            path=located.path,
            base=located.base,
            files=dict(files),
            state=state,
            problems=tuple(problems),
            manifest=manifest,
            manifest_name=names["manifest"],
            marker_name=names["neff"],
            committed=committed,
        )
