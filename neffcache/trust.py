"""Which entries a reader trusts: its trusted keys, their scopes, and whether unsigned may pass.

A reader holds a :class:`TrustPolicy` (settings ``trusted_keys``, ``[[trust]]`` tables,
``require_signed``; docs/security.md). :func:`judge` says what one entry's manifest proves
(:class:`Admission`), and the policy says whether that refuses it:

- ``signed``: the signature is a trusted key's, over this manifest at this entry path, and the
  key may sign for this store and namespace: admitted;
- ``bad-signature`` (a trusted key's id over bytes it did not sign: the NEFF, its digests, the
  provenance or the entry's path were changed), ``revoked`` (a key the policy withdrew) and
  ``out-of-scope`` (a trusted key, outside the stores or namespaces it may sign for: a pull
  request's key on main's store) are refused always: each is a claim the policy denies;
- ``unsigned`` and ``unknown-key`` are refused under ``require_signed`` and reported otherwise,
  so caches filled before signing keep working until their readers ask for more.

Why scopes live here and not in the signature: the signature binds the entry's path *in* the
store, so the same entry is valid in every tier that holds it; which store an identity may
write is the reader's policy (Bazel's "only CI writes what main reads", GitHub's per-ref
scopes). Pure: the keys are loaded by the caller (neffcache/signing.py), nothing here reads a
store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from neffcache.manifest import Manifest
from neffcache.signing import PublicKey


class Verdict(StrEnum):
    SIGNED = "signed"
    UNSIGNED = "unsigned"
    UNKNOWN_KEY = "unknown-key"
    OUT_OF_SCOPE = "out-of-scope"
    REVOKED = "revoked"
    BAD_SIGNATURE = "bad-signature"


# Refused whatever require_signed says: the policy denies what the manifest claims.
_ALWAYS_REFUSED = frozenset({Verdict.BAD_SIGNATURE, Verdict.REVOKED, Verdict.OUT_OF_SCOPE})


@dataclass(frozen=True)
class TrustedKey:
    """A public key and where it may sign: store URL prefixes and namespace path prefixes
    (empty: anywhere); ``revoked``: its entries are refused (a key rotated out after a leak)."""

    key: PublicKey
    stores: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    revoked: bool = False

    def covers(self, store_url: str, namespace: str) -> bool:
        where = store_location(store_url)
        return (not self.stores or any(_under(where, store_location(s)) for s in self.stores)) and (
            not self.namespaces or any(_under(namespace, n) for n in self.namespaces))


@dataclass(frozen=True)
class Admission:
    """What one entry's manifest proves under a policy: the verdict, who signed (if anyone) and
    the reason in words; ``refused`` by the policy or admitted."""

    verdict: Verdict
    refused: bool
    detail: str
    key_id: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"verdict": self.verdict.value, "refused": self.refused, "detail": self.detail,
                "key_id": self.key_id}


@dataclass(frozen=True)
class TrustPolicy:
    keys: Mapping[str, TrustedKey] = field(default_factory=dict)  # by key id
    require_signed: bool = False
    revoked_ids: frozenset[str] = frozenset()  # revoked by id alone (no .pub file at hand)

    @classmethod
    def of(cls, keys: Sequence[TrustedKey], *, require_signed: bool = False,
           revoked_ids: frozenset[str] = frozenset()) -> TrustPolicy:
        """A policy of ``keys``; a key listed twice keeps its widest scope, and revoked wins."""
        merged: dict[str, TrustedKey] = {}
        for trusted in keys:
            seen = merged.get(trusted.key.id)
            if seen is None:
                merged[trusted.key.id] = trusted
                continue
            wide = not seen.stores or not trusted.stores, not seen.namespaces or not trusted.namespaces
            merged[trusted.key.id] = TrustedKey(
                seen.key, () if wide[0] else tuple(dict.fromkeys([*seen.stores, *trusted.stores])),
                () if wide[1] else tuple(dict.fromkeys([*seen.namespaces, *trusted.namespaces])),
                seen.revoked or trusted.revoked)
        return cls(merged, require_signed, frozenset(revoked_ids))

    @property
    def active(self) -> bool:
        """Whether the policy asks anything of an entry (a key to check, or signatures required)."""
        return bool(self.keys) or self.require_signed or bool(self.revoked_ids)

    def judge(self, store_url: str, entry_path: str, namespace: str, manifest: Manifest | None) -> Admission:
        """What ``manifest`` (None: the entry has none) proves for the entry at ``entry_path`` in
        namespace ``namespace`` of the store ``store_url``."""
        sig = manifest.signature if manifest is not None else None
        if manifest is None or sig is None:
            what = "no manifest" if manifest is None else "an unsigned manifest"
            return self._admit(Verdict.UNSIGNED, f"{what}: nothing vouches for who made it")
        trusted = self.keys.get(sig.key_id)
        if sig.key_id in self.revoked_ids:
            return self._admit(Verdict.REVOKED, f"signed by key {sig.key_id}, which is revoked", sig.key_id)
        if trusted is None:
            return self._admit(Verdict.UNKNOWN_KEY, f"signed by key {sig.key_id}, which this reader does not "
                               "trust", sig.key_id)
        if trusted.revoked:
            return self._admit(Verdict.REVOKED, f"signed by key {sig.key_id}, which is revoked", sig.key_id)
        if not trusted.key.verifies(manifest, entry_path):
            return self._admit(Verdict.BAD_SIGNATURE, f"the signature of key {sig.key_id} does not match this "
                               "manifest at this path: its files, record or path changed since it was signed",
                               sig.key_id)
        if not trusted.covers(store_url, namespace):
            return self._admit(Verdict.OUT_OF_SCOPE, f"signed by key {sig.key_id} ({trusted.key.source or 'trusted'}"
                               f"), which may not sign for {store_url} {namespace or '(root)'}", sig.key_id)
        return self._admit(Verdict.SIGNED, f"signed by trusted key {sig.key_id}", sig.key_id)

    def _admit(self, verdict: Verdict, detail: str, key_id: str | None = None) -> Admission:
        refused = verdict in _ALWAYS_REFUSED or (self.require_signed and verdict is not Verdict.SIGNED)
        return Admission(verdict, refused, detail, key_id)


def store_location(url: str) -> str:
    """Where a store lies, whatever spells it: a local directory's ``file://`` and ``fsx://``
    URLs and its plain path are one place (``fsx:///mnt/c`` is ``/mnt/c``); others as given."""
    for scheme in ("file://", "fsx://"):
        if url.startswith(scheme):
            return url[len(scheme):].removeprefix("localhost") or "/"
    return url


def _under(value: str, prefix: str) -> bool:
    """Whether ``value`` is ``prefix`` or lies below it, path-wise (``s3://b/main`` covers
    ``s3://b/main/x``, not ``s3://b/main2``)."""
    value, prefix = value.rstrip("/"), prefix.rstrip("/")
    return not prefix or value == prefix or value.startswith(prefix + "/")
