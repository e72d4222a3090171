"""The trust settings made real: the signing key a publisher uses and the policy a reader holds.

One place turns ``signing_key``, ``trusted_keys``, ``revoked_keys``, ``require_signed`` and the
``[[trust]]`` tables (neffcache/application/config.py) into a
:class:`~neffcache.signing.SigningKey` and a :class:`~neffcache.trust.TrustPolicy`, so every
command that reads or writes entries (verify, pull, prefetch, tiers, warm, rewarm, push)
applies the same policy. A key file that cannot be read is a ConfigError naming it: a reader
that asked for signatures must not silently check nothing.
"""

from __future__ import annotations

import os

from neffcache.application.config import Settings
from neffcache.errors import ConfigError
from neffcache.operations.publisher import Publisher
from neffcache.signing import PublicKey, SigningKey
from neffcache.trust import TrustedKey, TrustPolicy


def signing_key(settings: Settings) -> SigningKey | None:
    """The publisher's key, or None when none is set (what it publishes is then unsigned)."""
    return SigningKey.load(settings.signing_key) if settings.signing_key else None


def trust_policy(settings: Settings, *, require_signed: bool | None = None) -> TrustPolicy:
    """The reader's policy: every trusted key (unscoped from ``trusted_keys``, scoped from the
    ``[[trust]]`` tables), the revoked ones, and ``require_signed`` (a flag overrides the setting)."""
    keys = [TrustedKey(PublicKey.load(path)) for path in settings.trusted_keys]
    for table in settings.trust:
        keys.append(TrustedKey(PublicKey.load(table["key"]), stores=tuple(_absolute(s) for s in table["stores"]),
                               namespaces=tuple(table["namespaces"]), revoked=bool(table["revoked"])))
    revoked_ids = set()
    for revoked in settings.revoked_keys:  # a key id, or the .pub file of one
        is_id = len(revoked) == 16 and not revoked.strip("0123456789abcdef")
        revoked_ids.add(revoked if is_id else PublicKey.load(revoked).id)
    required = settings.require_signed if require_signed is None else require_signed
    if required and not any(k.key.id not in revoked_ids and not k.revoked for k in keys):
        raise ConfigError("signatures are required (--require-signed, NEFFCACHE_REQUIRE_SIGNED) but no key is "
                          "trusted: name the publishers' .pub files in trusted_keys (NEFFCACHE_TRUSTED_KEYS)")
    return TrustPolicy.of(keys, require_signed=required, revoked_ids=frozenset(revoked_ids))


def publisher(settings: Settings, how: str) -> Publisher:
    """This process as a publisher: what it mints is ``how`` (the command), signed with the
    settings' key when one is set, on the configured instance type."""
    return Publisher(how=how, signing_key=signing_key(settings), instance=settings.instance)


def _absolute(store: str) -> str:
    """A scope's store as the store spells its root: a relative directory made absolute."""
    return store if "://" in store or os.path.isabs(store) else os.path.abspath(store)
