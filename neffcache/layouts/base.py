"""What every layout knows: how a runtime arranges entries under a cache root."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

from neffcache.entry import Entry, FileInfo, Namespace
from neffcache.instances import TARGETS
from neffcache.manifest import Manifest
from neffcache.toolchain import Toolchain

TEMP_MARKER = ".neffcache-tmp-"
# neffcache's namespace directory above a runtime's own versioned directory.
TARGET_DIR_RE = r"(?:(?P<tdir>(?:" + "|".join(TARGETS) + r")-lnc(?P<lnc>[12]))/)?"


def parse_target_dir(match: re.Match[str]) -> tuple[str | None, int | None]:
    tdir = match.group("tdir")
    if not tdir:
        return None, None
    return tdir.split("-lnc")[0], int(match.group("lnc"))


@dataclass(frozen=True)
class Located:
    """Where one listed file belongs: which entry, under which name."""

    namespace: Namespace
    key: str
    path: str
    base: str
    name: str


@dataclass(frozen=True)
class EntryPlan:
    """The store paths of an entry that is about to be written, in commit order."""

    namespace: Namespace
    key: str
    path: str
    base: str
    manifest_name: str
    marker_name: str


class Layout(ABC):
    name: str

    @abstractmethod
    def namespace_for(self, toolchain: Toolchain) -> Namespace:
        """The namespace neffcache manages for ``toolchain`` (target directory included)."""

    @abstractmethod
    def locate(self, path: str) -> Located | None:
        """Which entry a store-relative file path belongs to, or None if not this layout's."""

    @abstractmethod
    def classify(
        self, located: Located, files: Mapping[str, FileInfo], manifest: Manifest | None,
        manifest_error: str | None = None,
    ) -> Entry:
        """Build the entry and its state from the files the listing found."""

    @abstractmethod
    def plan_entry(self, namespace: Namespace, key: str) -> EntryPlan:
        """Where an entry of ``key`` lives in ``namespace``."""

    @abstractmethod
    def job_env(self, root: str, namespace: Namespace) -> dict[str, str]:
        """The environment a runtime needs to use ``namespace`` under the local path ``root``."""

    @abstractmethod
    def write_order(self, names: list[str], marker: str, manifest: str) -> list[str]:
        """Names in the order a publisher writes them: manifest, data, then the marker."""

    def manifest_problems(self, files: Mapping[str, FileInfo], manifest: Manifest) -> list[str]:
        """Cheap checks a listing allows: every recorded file present with its recorded size."""
        problems = []
        for name, digest in manifest.files.items():
            info = files.get(name)
            if info is None:
                problems.append(f"{name} recorded in the manifest is missing")
            elif info.size != digest.size:
                problems.append(f"{name} is {info.size} bytes, the manifest says {digest.size}")
        return problems
