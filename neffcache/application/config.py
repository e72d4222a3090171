"""Settings from ``NEFFCACHE_*`` variables and ``neffcache.toml``.

Precedence, highest first (a command-line flag beats all of these):

1. environment variables ``NEFFCACHE_<NAME>`` (lists comma-separated: ``NEFFCACHE_STORES``);
2. the file named by ``NEFFCACHE_CONFIG``, else ``./neffcache.toml`` in the working directory;
3. the user's ``$XDG_CONFIG_HOME/neffcache/neffcache.toml`` (``~/.config/...``);
4. the defaults below.

A file may hold the keys at its top level or under a ``[neffcache]`` table.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neffcache.errors import ConfigError
from neffcache.layouts.base import DEFAULT_LAYOUT
from neffcache.tags import check_user_tags
from neffcache.toolchain import Toolchain, resolve_toolchain
from neffcache.units import parse_duration

ENV_PREFIX = "NEFFCACHE_"
# Node-local runtime tiers (vLLM's VLLM_CACHE_ROOT) go under here by default: local disk that
# survives a reboot on most distributions, never the shared store.
DEFAULT_LOCAL_ROOT = "/var/tmp/neffcache-local"  # noqa: S108


def default_cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "neffcache"


@dataclass(frozen=True)
class Settings:
    stores: tuple[str, ...] = ()  # ordered tiers, fastest first
    index_url: str | None = None
    token: str | None = None
    instance: str | None = None
    compiler: str | None = None  # path of neuronx-cc; default: the one on PATH
    compiler_version: str | None = None  # name the toolchain without running the compiler
    layout: str = DEFAULT_LAYOUT
    parallel: int = 0  # 0: one per core
    spool_dir: str | None = None
    endpoint_url: str | None = None  # S3-compatible endpoint for s3:// stores (before AWS_ENDPOINT_URL)
    tags: Mapping[str, str] = field(default_factory=dict)
    # Retention: quarantined entries older than this go with `prune --garbage` (reason
    # quarantine-expired); warm logs under the cache home older than this go when `warm` starts
    # and with `prune --garbage`.
    quarantine_days: float = 30.0
    warm_log_days: float = 14.0
    # A prune plan removing more than this share of a store's entry bytes needs --force.
    prune_max_share: float = 0.5
    # Seconds after which a cached compiler error no longer stands: warm and rewarm compile the
    # graph again (a fixed compiler gets another chance) and `prune --failed expired` removes
    # it. None: a compiler error stands until --retry-failed, as the runtime has it. A duration
    # in the file or the variable ("7d", "12h", or seconds).
    failed_ttl: float | None = None
    # The node-local directory for runtimes that keep a local tier beside the shared store
    # (vLLM-Neuron's VLLM_CACHE_ROOT): each toolchain's namespace path below it. Never inside
    # the shared store (`neffcache env` refuses it).
    local_root: str = DEFAULT_LOCAL_ROOT
    # Trust (docs/security.md): the key this process signs what it publishes with (a private key
    # file), the public keys a reader trusts (.pub files, each anywhere unless a [[trust]] table
    # scopes it), the keys it refuses, and whether unsigned entries are refused too.
    signing_key: str | None = None
    trusted_keys: tuple[str, ...] = ()
    revoked_keys: tuple[str, ...] = ()  # .pub files or key ids
    require_signed: bool = False
    trust: tuple[Mapping[str, Any], ...] = ()  # [[trust]] tables: key, stores, namespaces, revoked
    sources: tuple[str, ...] = ()  # where the values came from, for `neffcache config`

    @property
    def local_store(self) -> str:
        return self.stores[0] if self.stores else str(default_cache_home() / "store")


_FIELDS = {f.name: f for f in dataclasses.fields(Settings) if f.name != "sources"}
_NUMBERS = {"quarantine_days", "warm_log_days", "prune_max_share"}


def _coerce(name: str, value: Any, where: str) -> Any:
    kind = _FIELDS[name].type
    try:
        if name in ("stores", "trusted_keys", "revoked_keys"):
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(str(s).strip() for s in items if str(s).strip())
        if name == "require_signed":
            return _boolean(value)
        if name == "trust":
            return _trust_tables(value)
        if name == "tags":
            if isinstance(value, str):
                pairs = [p.split("=", 1) for p in value.split(",") if p.strip()]
                if any(len(p) != 2 for p in pairs):
                    raise ValueError("expected k=v,k=v")
                tags = {k.strip(): v.strip() for k, v in pairs}
            else:
                tags = {str(k): str(v) for k, v in dict(value).items()}
            check_user_tags(tags)
            return tags
        if name == "parallel":
            return int(value)
        if name == "failed_ttl":
            if isinstance(value, bool):
                raise ValueError("a duration, not true/false")
            seconds = parse_duration(value) if isinstance(value, str) else float(value)
            if not 0 < seconds < float("inf"):
                raise ValueError("a duration > 0, e.g. 7d")
            return seconds
        if name in _NUMBERS:
            number = float(value)
            if not 0 <= number < float("inf"):
                raise ValueError("must be a number >= 0")
            if name == "prune_max_share" and number > 1:
                raise ValueError("a share between 0 and 1")
            return number
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: bad value for {name} ({kind}): {value!r}: {exc}") from None


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("true or false (1/0)")


_TRUST_KEYS = {"key", "stores", "namespaces", "revoked"}


def _trust_tables(value: Any) -> tuple[Mapping[str, Any], ...]:
    """``[[trust]]`` tables: a ``key`` (a .pub file), optional ``stores`` and ``namespaces``
    (lists of prefixes it may sign for) and ``revoked``."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ValueError("[[trust]] tables (in neffcache.toml)")
    out = []
    for table in value:
        if not isinstance(table, dict) or not isinstance(table.get("key"), str) or set(table) - _TRUST_KEYS:
            raise ValueError(f"each [[trust]] table has a key (a .pub file) and only {', '.join(sorted(_TRUST_KEYS))}")
        for name in ("stores", "namespaces"):
            if not isinstance(table.get(name, []), list) or not all(isinstance(x, str) for x in table.get(name, [])):
                raise ValueError(f"[[trust]] {name} is a list of prefixes")
        out.append({"key": table["key"], "stores": tuple(table.get("stores", ())),
                    "namespaces": tuple(table.get("namespaces", ())), "revoked": _boolean(table.get("revoked", False))})
    return tuple(out)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    table = data.get("neffcache", data)
    unknown = sorted(set(table) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"{path}: unknown settings {', '.join(unknown)}; known: {', '.join(sorted(_FIELDS))}")
    return dict(table)


def config_files(environ: Mapping[str, str]) -> list[Path]:
    """Config files in increasing precedence."""
    user = Path(environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "neffcache" / "neffcache.toml"
    explicit = environ.get(ENV_PREFIX + "CONFIG")
    if explicit:
        if not Path(explicit).is_file():
            raise ConfigError(f"NEFFCACHE_CONFIG names {explicit}, which does not exist")
        return [user, Path(explicit)]
    return [user, Path.cwd() / "neffcache.toml"]


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Settings from files, then the environment, then ``overrides`` (flags; None = unset)."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: list[str] = []
    for path in config_files(env):
        if path.is_file():
            for name, value in _read_toml(path).items():
                values[name] = _coerce(name, value, str(path))
            sources.append(str(path))
    for name in _FIELDS:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None and raw != "":
            values[name] = _coerce(name, raw, ENV_PREFIX + name.upper())
            sources.append(ENV_PREFIX + name.upper())
    for name, value in overrides.items():
        if name not in _FIELDS:
            raise ConfigError(f"unknown setting {name}")
        if value is not None and value not in ((), {}):
            values[name] = _coerce(name, value, f"--{name.replace('_', '-')}")
    return Settings(**values, sources=tuple(sources))


def job_toolchain(settings: Settings, lnc: int | None = None) -> Toolchain:
    """The toolchain of the jobs ``settings`` describe: their instance type (required: a
    ConfigError names the flag and the variable) with the named compiler version, else the
    version of the named or installed ``neuronx-cc``; ``lnc`` overrides the instance's."""
    if not settings.instance:
        raise ConfigError("name the instance type the NEFFs are for: --instance trn2.48xlarge (or NEFFCACHE_INSTANCE)")
    return resolve_toolchain(settings.instance, compiler=settings.compiler,
                             compiler_version_override=settings.compiler_version, lnc=lnc)
