"""Choosing a store by URL: one registry, backends imported lazily (fsspec's registry habit).

======================  ==========================================================
``/path``, ``file://``  :class:`LocalStore`
``fsx:///mnt/fsx/x``    :class:`LocalStore` in shared-mount mode (group-writable, no flock)
``s3://bucket/prefix``  ``S3Store`` (needs ``neffcache[s3]``)
any other scheme        ``FsspecStore`` when fsspec knows it (``memory://``, ``gs://``...)
======================  ==========================================================
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from neffcache.errors import ConfigError, InvalidURL
from neffcache.stores.base import Store
from neffcache.stores.local import LocalStore
from neffcache.stores.mounts import on_network_filesystem

log = logging.getLogger(__name__)

# scheme -> (dotted path of the class, what to install when the import fails)
REGISTRY: dict[str, tuple[str, str]] = {
    "s3": ("neffcache.stores.s3:S3Store", "pip install 'neffcache[s3]'"),
}
_FSSPEC = ("neffcache.stores.fsspec_store:FsspecStore", "pip install fsspec")
_SCHEME_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")
_ONE_SLASH_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):/*")


def _known_scheme(scheme: str) -> bool:
    if scheme in REGISTRY or scheme in ("file", "fsx"):
        return True
    try:
        from fsspec.registry import known_implementations
    except ImportError:
        return False
    return scheme in known_implementations


def _load(dotted: str, hint: str, scheme: str) -> Callable[..., Store]:
    module_name, _, attr = dotted.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{scheme}:// stores need an extra package ({exc.name}): {hint}") from exc
    cls: Callable[..., Store] = getattr(module, attr)
    return cls


def _shared(path: str, shared: bool | None) -> bool:
    """``shared`` as given, else whether ``path`` is on a network mount (NFS, Lustre, ...)."""
    if shared is not None:
        return shared
    fstype = on_network_filesystem(path)
    if fstype is not None:
        log.info("%s is on a %s mount: using the shared-mount rules (as for fsx://)", path, fstype)
    return fstype is not None


def open_store(url: str, *, shared: bool | None = None, read_only: bool = False, create: bool = True,
               endpoint_url: str | None = None, max_concurrency: int | None = None, **options: Any) -> Store:
    """The store for ``url``. ``shared`` forces shared-mount mode for a local path.
    ``endpoint_url`` (an S3-compatible endpoint) and ``max_concurrency`` (requests in flight)
    go to ``s3://`` stores and are ignored by the others, so a command can pass the ones it was
    given to every store it opens."""
    if isinstance(url, str) and url.strip().lower().startswith("s3://"):
        if endpoint_url:
            options["endpoint_url"] = endpoint_url
        if max_concurrency is not None:
            options["max_concurrency"] = max_concurrency
    if not isinstance(url, str) or not url.strip():
        raise InvalidURL(str(url), "empty")
    url = url.strip()
    match = _SCHEME_RE.match(url)
    if match is None:
        if "://" in url or url.startswith(":"):
            raise InvalidURL(url, "expected a path or scheme://...")
        one_slash = _ONE_SLASH_RE.match(url)
        if one_slash is not None and _known_scheme(one_slash.group("scheme").lower()):
            # "s3:/bucket" is a mistyped URL, not a relative directory named "s3:".
            scheme = one_slash.group("scheme").lower()
            rest = url.split(":", 1)[1].lstrip("/")
            meant = f"{scheme}:///{rest}" if scheme in ("file", "fsx") else f"{scheme}://{rest}"
            raise InvalidURL(url, f"did you mean {meant}?")
        return LocalStore(url, shared=_shared(url, shared), read_only=read_only, create=create)
    scheme = match.group("scheme").lower()
    parts = urlsplit(url)
    if scheme in ("file", "fsx"):
        if parts.netloc not in ("", "localhost"):
            raise InvalidURL(url, f"{scheme}:// takes an absolute path (three slashes: {scheme}:///mnt/...)")
        if not parts.path.startswith("/"):
            raise InvalidURL(url, "the path must be absolute")
        mode = True if scheme == "fsx" and shared is None else _shared(parts.path, shared)
        return LocalStore(parts.path, shared=mode, read_only=read_only, create=create, url=url)
    if scheme in REGISTRY:
        dotted, hint = REGISTRY[scheme]
        return _load(dotted, hint, scheme)(url, read_only=read_only, **options)
    try:
        import fsspec
    except ImportError as exc:
        raise ConfigError(f"{scheme}:// needs fsspec: pip install fsspec") from exc
    if scheme not in fsspec.available_protocols():
        raise InvalidURL(url, f"unknown scheme {scheme}:// (paths, file://, fsx://, s3:// or an fsspec scheme)")
    return _load(*_FSSPEC, scheme)(url, read_only=read_only, **options)


__all__ = ["REGISTRY", "LocalStore", "Store", "open_store"]
