"""Which compiler versions the stores hold, checked before ``upgrade-report`` reads any entry.

A version is named by its namespace directories (``neuronxcc-<version>/``, at a store's root or
under a target directory), so whether the stores hold one is a listing of those few prefixes,
each stopped at its first file: cheap on any store. Only when a version is absent are the
stores listed whole, to name the versions they do hold (the error path pays, never the report).

Versions are matched exactly, as ``prune --keep-compiler`` matches them: ``2.28.1001.0`` is not
taken for ``2.28.1001.0+0badc0de``, because a store may hold two builds of one release, and a
report about the wrong build reads as a real answer. The error names the versions present and,
when the typed one is the release of exactly one of them, that one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from neffcache.entry import FileInfo
from neffcache.errors import ConfigError
from neffcache.layouts import get_layout
from neffcache.stores.base import Store
from neffcache.toolchain import version_key


def holds_any(stores: Sequence[Store], prefixes: Iterable[str]) -> bool:
    """Whether any of ``stores`` has a file below any of ``prefixes`` (directories)."""
    wanted = list(prefixes)
    for store in stores:
        for prefix in wanted:
            # A directory, not a string prefix: neuronxcc-2.28.1001.0 is no part of ...+0badc0de.
            if any(info.path.startswith(f"{prefix}/") for info in _first(store, prefix)):
                return True
    return False


def _first(store: Store, prefix: str) -> list[FileInfo]:
    for info in store.iter_files(prefix):
        return [info]
    return []


def present_versions(stores: Sequence[Store], layouts: Sequence[str]) -> list[str]:
    """The compiler versions whose namespaces ``stores`` hold, in version order."""
    found: set[str] = set()
    kinds = [get_layout(name) for name in layouts]
    for store in stores:
        for info in store.iter_files(""):
            for part in info.path.split("/")[:2]:
                for layout in kinds:
                    version = layout.namespace_version(part)
                    if version:
                        found.add(version)
    return sorted(found, key=version_key)


def missing_version_error(version: str, option: str, stores: Sequence[Store], layouts: Sequence[str]) -> ConfigError:
    """The error for a ``version`` (given as ``option``) that no store holds: it names the versions
    present, and the one whose release ``version`` is, when exactly one is."""
    present = present_versions(stores, layouts)
    where = ", ".join(s.url for s in stores)
    if not present:
        return ConfigError(f"{option} {version}: the stores hold no compiler's entries ({where}): check --store")
    builds = [p for p in present if p.split("+", 1)[0] == version]
    guess = f"; did you mean {builds[0]}?" if len(builds) == 1 else ""
    return ConfigError(f"{option} {version}: no entries of that compiler in {where} (versions present: "
                       f"{', '.join(present)}){guess} Versions are matched exactly; nothing was read")
