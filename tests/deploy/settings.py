"""Which settings the code really reads: environment variable names, server settings fields."""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from functools import cache
from importlib.util import find_spec
from pathlib import Path

from pydantic import ValidationError

from neffcache.application import config as library_config
from neffcache.server.config import ServerSettings

SERVER_PREFIX = "NEFFCACHE_SERVER_"


def _package_dirs(name: str) -> list[Path]:
    spec = find_spec(name)
    assert spec is not None and spec.submodule_search_locations, name
    return [Path(p) for p in spec.submodule_search_locations]


@cache
def _source_text(package: str) -> str:
    """All Python source of an installed package (neffcache's subpackages live in other folders)."""
    parts = []
    names = [package]
    if package == "neffcache":
        names += ["neffcache.cli", "neffcache.server", "neffcache.warmers"]
    for name in names:
        for folder in _package_dirs(name):
            parts += [p.read_text(errors="replace") for p in sorted(folder.rglob("*.py"))]
    return "\n".join(parts)


def server_env_names() -> set[str]:
    return {SERVER_PREFIX + name.upper() for name in ServerSettings.model_fields}


def library_env_names() -> set[str]:
    """NEFFCACHE_<FIELD> of the library settings, plus every NEFFCACHE_* name the source spells out."""
    fields = {library_config.ENV_PREFIX + f.name.upper() for f in dataclasses.fields(library_config.Settings)
              if f.name != "sources"}
    literal = set(re.findall(r"\bNEFFCACHE_[A-Z0-9_]*[A-Z0-9]\b", _source_text("neffcache")))
    return (fields | literal) - {n for n in literal if n.startswith(SERVER_PREFIX)}


def read_by_code(name: str) -> bool:
    """Is ``name`` an environment variable neffcache (or boto3, for AWS_*) actually reads?"""
    if name.startswith(SERVER_PREFIX):
        return name in server_env_names()
    if name.startswith("NEFFCACHE_"):
        return name in library_env_names()
    if name.startswith("AWS_"):
        return any(f"{q}{name}{q}" in _source_text(package) for q in "'\"" for package in ("botocore", "neffcache"))
    if name in ("XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "HOME", "PATH"):
        return name in _source_text("neffcache") or name in ("HOME", "PATH")
    return False


def server_settings_from_env(env: dict[str, str]) -> ServerSettings:
    """The server's settings built from exactly ``env`` (its NEFFCACHE_SERVER_* part), failing
    on names pydantic-settings would silently ignore."""
    ours = {k: v for k, v in env.items() if k.startswith(SERVER_PREFIX)}
    unknown = sorted(set(ours) - server_env_names())
    assert not unknown, f"not server settings (pydantic-settings would ignore them): {unknown}"
    values: dict[str, object] = {k[len(SERVER_PREFIX):].lower(): v for k, v in ours.items()}
    for name, field in ServerSettings.model_fields.items():
        # The env source decodes complex fields (prices, lists) from JSON before validating.
        if isinstance(values.get(name), str) and typing.get_origin(field.annotation) in (dict, list):
            values[name] = json.loads(str(values[name]))
    try:
        # Passing them as init values (extra="forbid" is enforced on those) with pydantic's
        # env-style coercion ("true", "5") gives exactly what the env source would produce.
        return ServerSettings.model_validate(values)
    except ValidationError as exc:  # pragma: no cover - the assertion message is the point
        raise AssertionError(f"the server rejects these settings: {exc}") from None

