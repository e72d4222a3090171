"""Toolchains: which compiler, for which target and LNC, produced (or may use) a NEFF.

A NEFF is only valid for the exact compiler version, compile target and logical-core
configuration it was built with, so those three are the identity of a cache namespace.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neffcache.errors import CompilerNotFound, ConfigError, ToolchainError
from neffcache.instances import TARGETS, lookup_instance

COMPILER_NAME = "neuronx-cc"


def target_dir(target: str, lnc: int) -> str:
    """The namespace directory neffcache adds so trn1 and trn2 NEFFs never mix."""
    return f"{target}-lnc{lnc}"


# Every target directory a store may hold, in the catalog's order.
TARGET_DIRS: tuple[str, ...] = tuple(target_dir(t, n) for t in TARGETS for n in (1, 2))
_VERSION_LINE = re.compile(r"NeuronX Compiler version\s+(?P<version>[0-9][0-9A-Za-z.+_-]*)")
# Versions become directory names (neuronxcc-<ver>), so they may not carry separators.
_SAFE_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+_-]*$")
# The layouts' names (neffcache.layouts.LAYOUTS, in its order) as a plain value: the index
# server validates the names clients send against it, and ships without the layouts.
# neffcache.layouts refuses to import if its registry says otherwise.
LAYOUT_NAMES: tuple[str, ...] = ("neuronxcc", "torchneuron", "vllm", "nxdi")


def version_key(version: str) -> tuple[Any, ...]:
    """Order compiler versions numerically: 2.9 < 2.10, 2.27.5334.0+f702b353 by its release part."""
    release, _, local = version.partition("+")
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.\-_]", release))
    return (parts, local)


def validate_version(version: str) -> str:
    if not _SAFE_VERSION.match(version):
        raise ConfigError(f"invalid compiler version {version!r} (expected e.g. 2.27.5334.0+f702b353)")
    return version


@dataclass(frozen=True, order=True)
class Toolchain:
    compiler_version: str
    target: str
    lnc: int

    def __post_init__(self) -> None:
        validate_version(self.compiler_version)
        if self.target not in TARGETS:
            raise ConfigError(f"unknown compile target {self.target!r}; known: {', '.join(TARGETS)}")
        if self.lnc not in (1, 2):
            raise ConfigError(f"LNC must be 1 or 2, not {self.lnc!r}")

    @property
    def target_dir(self) -> str:
        """The namespace directory neffcache adds so trn1 and trn2 NEFFs never mix."""
        return target_dir(self.target, self.lnc)

    @property
    def namespace_dir(self) -> str:
        """This toolchain's namespace directory in the default layout (``trn2-lnc2/neuronxcc-<ver>``):
        the index server labels charts with it so they read like the paths in a store
        (tests/layouts/test_knowledge_stays_in_layouts.py checks it against the layout)."""
        return f"{self.target_dir}/neuronxcc-{self.compiler_version}"

    @property
    def label(self) -> str:
        return f"neuronxcc-{self.compiler_version} {self.target} lnc={self.lnc}"

    def to_json(self) -> dict[str, object]:
        return {"compiler_version": self.compiler_version, "target": self.target, "lnc": self.lnc}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Toolchain:
        try:
            return cls(str(data["compiler_version"]), str(data["target"]), int(str(data["lnc"])))
        except KeyError as exc:
            raise ConfigError(f"toolchain record lacks {exc.args[0]!r}") from None

    @classmethod
    def for_instance(cls, instance_type: str, compiler_version: str, lnc: int | None = None) -> Toolchain:
        row = lookup_instance(instance_type)
        return cls(compiler_version, row.target, lnc if lnc is not None else row.default_lnc)


def parse_compiler_version(output: str) -> str:
    """The version from ``neuronx-cc --version`` output (first matching line)."""
    for line in output.splitlines():
        match = _VERSION_LINE.search(line)
        if match:
            return match.group("version")
    first = output.strip().splitlines()[0] if output.strip() else "(no output)"
    raise ToolchainError(f"cannot read a compiler version from `{COMPILER_NAME} --version`: {first!r}")


def find_compiler(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The ``neuronx-cc`` executable: the explicit path if given, else the one on PATH."""
    if explicit is not None:
        path = Path(explicit)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        found = shutil.which(str(explicit))
        if found:
            return Path(found)
        raise CompilerNotFound(str(explicit))
    found = shutil.which(COMPILER_NAME)
    if not found:
        raise CompilerNotFound(COMPILER_NAME)
    return Path(found)


def compiler_version(compiler: str | os.PathLike[str] | None = None, *, timeout: float = 60.0) -> str:
    """Run ``neuronx-cc --version`` and parse it."""
    exe = find_compiler(compiler)
    try:
        proc = subprocess.run(
            [str(exe), "--version"], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"could not run `{exe} --version`: {exc}") from exc
    if proc.returncode != 0:
        raise ToolchainError(
            f"`{exe} --version` exited {proc.returncode}: {proc.stderr.strip()[:300]}"
        )
    return parse_compiler_version(proc.stdout + "\n" + proc.stderr)


def resolve_toolchain(
    instance_type: str,
    *,
    compiler: str | os.PathLike[str] | None = None,
    compiler_version_override: str | None = None,
    lnc: int | None = None,
) -> Toolchain:
    """The toolchain a job on ``instance_type`` uses with the installed (or named) compiler."""
    row = lookup_instance(instance_type)  # fail on a bad instance before running anything
    version = (
        validate_version(compiler_version_override)
        if compiler_version_override
        else compiler_version(compiler)
    )
    return Toolchain(version, row.target, lnc if lnc is not None else row.default_lnc)
