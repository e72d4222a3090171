"""A manifest once written is never silently lost (issue 37).

Who can write a shared store can replace a committed NEFF and delete its manifest: the entry then
reads as one a runtime wrote (no manifest, nothing to check against), ``verify`` used to pass it
and ``push`` to mint a fresh manifest for the substitute and commit it elsewhere. The store alone
cannot tell the two apart, so the evidence comes from outside it: the index server, which
recorded the entry's NEFF digest when neffcache published it (each record bound to the token
that wrote it), answers whether this path ever had a manifest.

- :func:`recorded_digests`: the NEFF digests the index recorded for a set of entry paths, in
  batched lookups. An index that cannot answer proves nothing: {} and a warning, never a
  refusal (a down index must not stop a push that has nothing to do with it).
- :func:`lost_problem`: for an entry without a manifest that the index recorded, what the store
  holds now against what was recorded: the same NEFF (the manifest alone was lost: ``push
  --adopt`` restores one) or another one (a substitute). Either way it is a problem, kind
  ``manifest:``, that ``verify`` reports (non-zero) and ``push`` does not paper over without
  ``--adopt``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from neffcache.entry import Entry
from neffcache.errors import EntryNotFound, IndexServerError, InvalidKey
from neffcache.layouts import get_layout
from neffcache.operations.ingest import digest_of
from neffcache.stores.base import Store

log = logging.getLogger(__name__)


class RecordLookup(Protocol):
    def lookup_many(self, paths: Iterable[str]) -> Mapping[str, Mapping[str, Any] | None]: ...


def recorded_digests(index: RecordLookup, paths: Iterable[str]) -> dict[str, str]:
    """path -> the NEFF sha256 the index recorded for it, for the paths it has a digest of."""
    wanted = list(dict.fromkeys(paths))
    if not wanted:
        return {}
    try:
        found = index.lookup_many(wanted)
    except (IndexServerError, InvalidKey) as exc:
        log.warning("the index could not say which entries it recorded (%s): lost manifests go unchecked", exc)
        return {}
    out = {}
    for path, record in found.items():
        digest = record.get("neff_sha256") if isinstance(record, Mapping) else None
        if isinstance(digest, str) and len(digest) == 64:
            out[path] = digest
    return out


def lost_problem(store: Store, entry: Entry, recorded: str) -> str:
    """What to say of ``entry`` (no manifest) whose NEFF the index recorded as ``recorded``."""
    neff = get_layout(entry.layout).neff_of(entry)
    now = None
    if neff is not None:
        try:
            now = digest_of(store, entry.store_path(neff)).sha256
        except (EntryNotFound, InvalidKey, OSError):
            now = None
    if now == recorded:
        return ("manifest: lost: neffcache published this entry (the index recorded its NEFF) and its manifest is "
                "gone; the NEFF still matches the record (`neffcache push --adopt` writes a new manifest)")
    said = f"now hashes to {now[:12]}…" if now else "cannot be read"
    return (f"manifest: lost: neffcache published this entry with NEFF sha256 {recorded[:12]}… (the index's "
            f"record) and its manifest is gone; the NEFF {said}: a substitute is likely, do not load it")
