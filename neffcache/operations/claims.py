"""What an entry proves about itself, beyond its digests: who vouches for it, and whether its own
inputs agree with where it lies (issue 37).

Two questions every reader of a shared store asks before it hands a NEFF to the accelerator
(verify, pull, prefetch, tier reads):

- :func:`admission`: what its manifest's signature proves under the reader's trust policy
  (neffcache/trust.py), judged at the entry's canonical path (neffcache/operations/publisher.py), so an
  entry in a node-local tier of its runtime's own form verifies as it did in the shared tier;
- :func:`self_problems`: what it says against its namespace, read through a :data:`Reader`
  (the store for ``verify`` and ``show``; a transfer's staged copies for pull, prefetch and
  tier reads, so a check costs no request of its own). Its flags file's ``--target`` /
  ``--lnc`` (neffcache/layouts/stated.py) and its provenance's compiler version must be the
  namespace's: a trn1 NEFF in a trn2 namespace is a false hit the runtime does not catch. Each
  problem starts with its kind (``target:``, ``compiler:``), so reports can group them.

Both read only what the entry holds (its manifest is already parsed; the flags file is small
and bounded), and neither raises for what a store holds: an unreadable flags file proves
nothing, so it is no problem here (verify reports unreadable files on its own).
"""

from __future__ import annotations

from collections.abc import Callable

from neffcache.entry import Entry
from neffcache.errors import EntryNotFound, InvalidKey
from neffcache.layouts import get_layout
from neffcache.layouts.stated import toolchain_problems
from neffcache.operations.publisher import entry_canonical_path
from neffcache.stores.base import Store
from neffcache.trust import Admission, TrustPolicy

MAX_FLAGS_FILE = 1 << 20  # bytes: a flags file is a line of options


# An entry file's bytes by name; ValueError for a file larger than the reader's bound.
Reader = Callable[[str], bytes]


def admission(policy: TrustPolicy, store_url: str, entry: Entry) -> Admission:
    """What ``entry``'s manifest proves under ``policy`` in the store at ``store_url`` (no I/O:
    the manifest is read already)."""
    return policy.judge(store_url, entry_canonical_path(entry), entry.namespace.path, entry.manifest)


def distrust(policy: TrustPolicy, store_url: str, entry: Entry) -> str | None:
    """Why a reader holding ``policy`` refuses ``entry``'s manifest, or None."""
    verdict = admission(policy, store_url, entry)
    return f"{verdict.verdict.value}: {verdict.detail}" if verdict.refused else None


def contradiction(entry: Entry, read: Reader) -> str | None:
    """What ``entry`` contradicts in its namespace (:func:`self_problems`), as one line, or None:
    the check a transfer runs on its staged copies before it publishes (``transfer(vet=)``)."""
    return "; ".join(self_problems(entry, read)) or None


def store_reader(store: Store, entry: Entry, limit: int = MAX_FLAGS_FILE) -> Reader:
    """Read an entry's small files from ``store``: at most ``limit`` bytes, ValueError beyond."""

    def read(name: str) -> bytes:
        with store.open_read(entry.store_path(name)) as stream:
            data: bytes = stream.read(limit + 1)
        if len(data) > limit:
            raise ValueError(f"{name} is larger than {limit} bytes")
        return data

    return read


def self_problems(entry: Entry, read: Reader) -> list[str]:
    """Where ``entry``'s own record contradicts its namespace: ``target: ...``, ``compiler: ...``."""
    problems = [f"target: {p}" for p in _flags_problems(entry, read)]
    provenance = entry.manifest.provenance if entry.manifest is not None else None
    said = provenance.toolchain if provenance is not None else None
    version = entry.namespace.compiler_version
    if said is not None and version is not None and said.compiler_version != version:
        problems.append(f"compiler: its provenance says compiler {said.compiler_version}, but it lies in the "
                        f"namespace of {version} ({entry.namespace.path})")
    return problems


def _flags_problems(entry: Entry, read: Reader) -> list[str]:
    layout = get_layout(entry.layout)
    name = layout.flags_of(entry)
    if name is None:
        return []
    try:
        return toolchain_problems(entry.namespace, layout.stated_flags(name, read(name)))
    except (EntryNotFound, InvalidKey, OSError, ValueError):
        return []
