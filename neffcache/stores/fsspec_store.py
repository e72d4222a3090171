"""A cache root on any other filesystem fsspec knows (``memory://``, ``gs://``, ``az://``...).

The store contract asks two things a generic filesystem may not give:

*Whole files.* Object stores (gs, az, memory...) make an object visible only when its upload
completes, so a file is written in one call. Filesystem-like backends (sftp, smb, webdav...)
show a file while it is being written, so those get a temp name (``.neffcache-tmp-``) and a
``mv`` into place, which is a rename where the backend has one.

*Exclusive create (first writer wins).* Honestly, it depends on the backend:

- ``memory://`` is one process's dictionary; a process-wide lock around check-and-create
  makes it atomic (tested by the contract suite);
- everything else goes through ``pipe_file(mode="create")``, which backends with conditional
  writes implement atomically (s3fs with If-None-Match, gcsfs with ifGenerationMatch=0,
  adlfs with If-None-Match) and fsspec's default implements as exists-then-write. Between
  processes or hosts that default has a window in which two publishers can both "win"; the
  lease in front of every publish narrows it but rests on the same primitive. neffcache has
  verified atomic first-writer-wins only for ``memory://`` here and for S3 via S3Store, and
  says so once per process (a warning) for any other scheme.
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import posixpath
import secrets
import sys
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

import fsspec
from fsspec.registry import known_implementations

from neffcache.entry import FileInfo
from neffcache.errors import AccessDenied, ConfigError, EntryNotFound, InvalidURL, StoreError, StoreUnavailable
from neffcache.keys import safe_relpath
from neffcache.stores.base import TEMP_MARKER, FileSource, Store

log = logging.getLogger(__name__)

# Backends whose single write call makes an object appear whole (no temp name needed).
WHOLE_OBJECT_WRITES = frozenset({"memory", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "s3", "s3a",
                                 "r2", "b2", "tos", "cos", "obs"})
VERIFIED_EXCLUSIVE = frozenset({"memory"})
_warned: set[str] = set()
_warn_lock = threading.Lock()
_process_lock = threading.Lock()  # memory:// is per process: this makes check-and-create atomic


def _mtime(info: dict[str, Any]) -> float:
    for name in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        value = info.get(name)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return 0.0


def _missing_backend(protocol: str, exc: ImportError) -> str:
    """One line naming what to install: ``gs:// stores need gcsfs: pip install gcsfs``."""
    missing = exc.name or (exc.__cause__.name if isinstance(exc.__cause__, ImportError) else None)
    if not missing:
        dotted = str(known_implementations.get(protocol, {}).get("class", ""))
        missing = dotted.split(".", 1)[0] if dotted and not dotted.startswith("fsspec.") else None
    if missing:
        return f"{protocol}:// stores need the package {missing}: pip install {missing}"
    hint = known_implementations.get(protocol, {}).get("err") or f"install the fsspec backend for {protocol}://"
    return f"{protocol}:// stores need an extra package: {hint}"


def _construct(cls: type[Any], url: str, protocol: str, options: dict[str, Any]) -> Any:
    """The backend's filesystem, with what the URL says (host, user...) as fsspec's own
    ``url_to_fs`` would take it. A constructor that fails leaves a half-built object whose
    ``__del__`` may raise at garbage collection (``FTPFileSystem`` has no ``.ftp`` yet): that
    would print an "Exception ignored" traceback after the one-line error, so the error is
    raised only after the object is gone, with that ``__del__``'s complaint swallowed."""
    error: Exception | None = None
    own_del = getattr(cls, "__del__", None)
    previous = sys.unraisablehook

    def quiet(unraisable: Any) -> None:
        if own_del is None or unraisable.object is not own_del:
            previous(unraisable)

    sys.unraisablehook = quiet
    try:
        try:
            kwargs = {**cls._get_kwargs_from_urls(url), **options}
            return cls(**kwargs)
        except ImportError as exc:
            error = ConfigError(_missing_backend(protocol, exc))
        except TypeError as exc:
            error = ConfigError(f"bad options for {protocol}://: {exc}")
        except Exception as exc:  # a backend's own setup error (credentials, endpoint, host...)
            error = StoreUnavailable(f"cannot open {url}: {type(exc).__name__}: {exc}", store=url)
        gc.collect()  # the half-built object, while its __del__ is kept quiet
    finally:
        sys.unraisablehook = previous
    raise error


class FsspecStore(Store):
    def __init__(self, url: str, *, read_only: bool = False, **storage_options: Any) -> None:
        protocol = url.split("://", 1)[0].lower()
        try:
            cls = fsspec.get_filesystem_class(protocol)
        except ImportError as exc:
            raise ConfigError(_missing_backend(protocol, exc)) from None
        except ValueError:
            raise InvalidURL(url, f"fsspec knows no scheme {protocol}://") from None
        self.fs = _construct(cls, url, protocol, storage_options)
        self.protocol = protocol
        self.root = str(cls._strip_protocol(url)).rstrip("/")
        super().__init__(url.rstrip("/"), read_only=read_only)
        self.whole_object_writes = protocol in WHOLE_OBJECT_WRITES
        self.exclusive_is_atomic = protocol in VERIFIED_EXCLUSIVE
        if not self.exclusive_is_atomic and not read_only:
            with _warn_lock:
                if protocol not in _warned:
                    _warned.add(protocol)
                    log.warning("%s:// has no exclusive create neffcache has verified; first-writer-wins "
                                "relies on the backend's pipe_file(mode='create') (see docs/remote-tiers.md)",
                                protocol)

    def _abs(self, path: str) -> str:
        rel = safe_relpath(path)
        return f"{self.root}/{rel}" if self.root else rel

    def _rel(self, full: str) -> str:
        full = str(self.fs._strip_protocol(full))
        return full[len(self.root) + 1:] if self.root else full.lstrip("/")

    @contextlib.contextmanager
    def _errors(self, path: str | None) -> Iterator[None]:
        try:
            yield
        except (EntryNotFound, StoreError):
            raise
        except PermissionError as exc:
            raise AccessDenied(f"access denied to {self.url}: {exc}", store=self.url, path=path) from exc
        except (ConnectionError, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot reach {self.url}: {exc}", store=self.url, path=path) from exc

    # -- primitives ---------------------------------------------------------------------------
    def iter_files(self, prefix: str = "") -> Iterator[FileInfo]:
        base = self._abs(prefix) if prefix else self.root
        with self._errors(prefix):
            try:
                found = self.fs.find(base, detail=True, withdirs=False)
            except FileNotFoundError:
                return
        for name, info in found.items():
            if info.get("type", "file") != "file":
                continue
            rel = self._rel(name)
            if rel and not rel.startswith("../"):
                yield FileInfo(rel, int(info.get("size") or 0), _mtime(info))

    def stat(self, path: str) -> FileInfo | None:
        full = self._abs(path)
        with self._errors(path):
            try:
                info = self.fs.info(full)
            except (FileNotFoundError, NotADirectoryError):
                return None
        if info.get("type", "file") != "file":
            return None
        return FileInfo(safe_relpath(path), int(info.get("size") or 0), _mtime(info))

    @contextlib.contextmanager
    def open_read(self, path: str) -> Iterator[BinaryIO]:
        full = self._abs(path)
        with self._errors(path):
            try:
                if self.protocol == "memory":
                    # memory:// hands every reader the same file object (one shared position).
                    stream: Any = io.BytesIO(self.fs.cat_file(full))
                else:
                    stream = self.fs.open(full, "rb")
            except (FileNotFoundError, IsADirectoryError):
                raise EntryNotFound(f"{path} not found in {self.url}", store=self.url, path=path) from None
        with stream:
            yield stream

    def _put_file(self, path: str, source: FileSource, *, exclusive: bool, move: bool) -> bool:
        full = self._abs(path)
        with self._errors(path):
            if not self.whole_object_writes:
                self.fs.makedirs(posixpath.dirname(full), exist_ok=True)
            if exclusive:
                return self._create(full, source)
            if self.whole_object_writes:
                self._write(full, source)
            else:
                # A visible-while-written filesystem: write aside, then move into place.
                tmp = posixpath.join(posixpath.dirname(full),
                                     f".{posixpath.basename(full)}{TEMP_MARKER}{secrets.token_hex(6)}")
                try:
                    self._write(tmp, source)
                    self.fs.mv(tmp, full)
                finally:
                    with contextlib.suppress(FileNotFoundError, OSError):
                        if self.fs.exists(tmp):
                            self.fs.rm_file(tmp)
        return True

    def _write(self, full: str, source: FileSource) -> None:
        if isinstance(source, bytes):
            self.fs.pipe_file(full, source)
        elif self.protocol == "memory":
            self.fs.pipe_file(full, source.read_bytes())  # its put_file shows a growing file
        else:
            self.fs.put_file(str(source), full)

    def _create(self, full: str, source: FileSource) -> bool:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        lock = _process_lock if self.protocol == "memory" else contextlib.nullcontext()
        with lock:
            if self.fs.exists(full):
                return False
            try:
                self.fs.pipe_file(full, data, mode="create")
            except FileExistsError:
                return False
            except TypeError:
                # A backend older than fsspec's mode="create": only the check above guards it.
                self.fs.pipe_file(full, data)
        return True

    def _delete(self, paths: list[str]) -> int:
        removed = 0
        for path in paths:
            full = self._abs(path)
            with self._errors(path):
                # Not every backend raises for a missing file: ask first, so the count is right.
                if not self.fs.isfile(full):
                    continue
                try:
                    self.fs.rm_file(full)
                except FileNotFoundError:
                    continue
            removed += 1
        return removed

    def move(self, src: str, dst: str) -> None:
        self.check_writable()
        with self._errors(src):
            try:
                self.fs.mv(self._abs(src), self._abs(dst))
            except FileNotFoundError:
                raise EntryNotFound(f"{src} not found in {self.url}", store=self.url, path=src) from None
