"""Every error neffcache raises on purpose.

The hierarchy, so a caller can catch at the depth it cares about::

    NeffcacheError
    ├── ConfigError (ValueError)            bad settings, bad config file
    │   ├── UnknownInstanceType             instance type not in the catalog
    │   └── InvalidURL                      a store URL we cannot parse or serve
    ├── InvalidKey (ValueError)             path traversal, absolute paths, bad characters
    ├── FlagsFileError (ValueError)         a flags file no compiler era writes, or no era for a version
    ├── ToolchainError (RuntimeError)
    │   └── CompilerNotFound (FileNotFoundError)
    ├── StoreError (OSError)                anything a store could not do
    │   ├── StoreUnavailable                tier down, bucket missing, no credentials
    │   ├── AccessDenied (PermissionError)
    │   ├── UnsafePath                      a symlink below the root would be followed, or a FIFO/device
    │   ├── EntryNotFound (KeyError)
    │   ├── ReadOnlyStore
    │   └── NoSpace                         ENOSPC/EDQUOT/EFBIG writing to the destination
    ├── CorruptEntry                        digests or manifest do not match the files
    │   └── PlaceholderNeff                 a `plan` placeholder where a NEFF goes: never committed
    ├── UntrustedEntry                      whole and matching, but its own inputs contradict where it lies
    ├── SourceChanged                       a file changed while it was being copied
    ├── LeaseHeld                           someone else holds a live lease
    ├── RefusedPlan                         a destructive plan that looks like a mistake (needs force)
    └── IndexServerError (RuntimeError)     the index server refused or failed

Errors subclass the matching builtin so code that knows nothing about neffcache still
catches them sensibly, and carry the attributes a message needs (path, key, store).
"""

from __future__ import annotations

from neffcache.placeholder import refusal


class NeffcacheError(Exception):
    """Base class of every error neffcache raises on purpose."""


class ConfigError(NeffcacheError, ValueError):
    """Settings that cannot work: a bad value, a bad config file."""


class UnknownInstanceType(ConfigError):
    def __init__(self, instance_type: str, known: list[str]) -> None:
        self.instance_type = instance_type
        self.known = known
        super().__init__(
            f"unknown instance type {instance_type!r}; known: {', '.join(known)}"
        )


class InvalidURL(ConfigError):
    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"bad store URL {url!r}: {reason}")


class InvalidKey(NeffcacheError, ValueError):
    """A key or relative path from outside that could escape the store root."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"invalid key {key!r}: {reason}")


class FlagsFileError(NeffcacheError, ValueError):
    """A layout-A flags file that cannot be read as its compiler era writes it, or a compiler
    version whose flags-file form is unknown (neffcache/layouts/flags.py)."""


class ToolchainError(NeffcacheError, RuntimeError):
    """The compiler could not be run or its output not understood."""


class CompilerNotFound(ToolchainError, FileNotFoundError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"{name!r} not found on PATH; install the Neuron SDK, pass --compiler, or use "
            "--compiler-version to name the toolchain without running it"
        )


class StoreError(NeffcacheError, OSError):
    """A store could not complete an operation."""

    def __init__(self, message: str, *, store: str | None = None, path: str | None = None) -> None:
        self.store = store
        self.path = path
        super().__init__(message)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StoreUnavailable(StoreError):
    """The store cannot be reached: tier down, bucket missing, no credentials."""


class AccessDenied(StoreError, PermissionError):
    pass


class UnsafePath(StoreError):
    """A path below a store root runs through a symlink that neffcache will not follow (one
    pointing outside the root, a dangling one, or a symlinked directory), or names something
    that is not a regular file where one belongs (a FIFO, a socket, a device: opening or
    reading it could block for ever, see neffcache/regular.py). It concerns that path only: a
    caller reports it against one entry and goes on with the rest."""

    def __init__(self, path: str, reason: str, *, store: str | None = None) -> None:
        self.reason = reason
        where = f" in {store}" if store else ""
        super().__init__(f"unsafe path {path}{where}: {reason}", store=store, path=path)


class EntryNotFound(StoreError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ReadOnlyStore(StoreError):
    pass


class NoSpace(StoreError):
    """The destination is full (or over quota, or over a file size limit).

    Its own class because the usual symptom, a short or failed write, must never be taken for
    corruption at the source: that would report (and with remote quarantine on, quarantine) a
    healthy entry elsewhere."""

    def __init__(self, store: str, *, path: str | None = None, reason: str = "") -> None:
        where = f" writing {path}" if path else ""
        super().__init__(f"no space at the destination {store}{where}" + (f" ({reason})" if reason else ""),
                         store=store, path=path)


class CorruptEntry(NeffcacheError):
    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(f"corrupt entry {path}: {'; '.join(problems)}")


class UntrustedEntry(NeffcacheError):
    """An entry whose files match its manifest, refused by a reader: its own inputs contradict its
    namespace (a ``--target=trn1`` NEFF in a trn2 namespace; neffcache/operations/claims.py).
    Nothing of it was committed; not corrupt, so never quarantined."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(f"refused entry {path}: {'; '.join(problems)}")


class PlaceholderNeff(CorruptEntry):
    """An entry whose NEFF is a placeholder ``neffcache plan`` wrote (neffcache/placeholder.py):
    refused wherever entries are committed; nothing of it was written. A CorruptEntry, so every
    caller that reports a bad entry and goes on with the rest does so for this one too."""

    def __init__(self, path: str, names: list[str]) -> None:
        self.names = names
        super().__init__(path, [refusal(name) for name in names])


class SourceChanged(NeffcacheError):
    """A file was rewritten while it was being copied: the bytes read no longer match the
    manifest. Nothing was committed at the destination; the copy can be retried later."""

    def __init__(self, path: str, *, store: str | None = None) -> None:
        self.path = path
        self.store = store
        super().__init__(f"{path} changed while it was being copied")


class LeaseHeld(NeffcacheError):
    def __init__(self, name: str, owner: str, expires_at: float) -> None:
        self.name = name
        self.owner = owner
        self.expires_at = expires_at
        super().__init__(f"lease {name} is held by {owner} until {readable_expiry(expires_at)}")


def readable_expiry(when: float, now: float | None = None) -> str:
    """``12:34:56 UTC (in 4 min)``: a wall time a person can compare with their clock, and how far."""
    import time

    now = time.time() if now is None else now
    stamp = time.strftime("%H:%M:%S UTC", time.gmtime(when))
    if abs(when - now) >= 86400:
        stamp = time.strftime("%Y-%m-%d ", time.gmtime(when)) + stamp
    delta = when - now
    span = abs(delta)
    amount = (f"{span:.0f} s" if span < 90 else f"{span / 60:.0f} min" if span < 5400 else f"{span / 3600:.1f} h")
    return f"{stamp} ({'in ' + amount if delta >= 0 else amount + ' ago'})"


class RefusedPlan(NeffcacheError):
    """A destructive plan the guard rails stop: it would empty a store, remove every entry of its
    newest toolchain, or more than the allowed share of its bytes. Nothing was changed; the
    caller may force it (``--force`` with ``--yes``)."""

    def __init__(self, message: str, guards: tuple[object, ...] = ()) -> None:
        self.guards = guards
        super().__init__(message)


class IndexServerError(NeffcacheError, RuntimeError):
    """The index server refused a request or could not be reached."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)
