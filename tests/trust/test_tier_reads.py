"""Tier reads under a trust policy (issue 37): an entry from a slower tier that the reader's
policy refuses is a miss there, reported, and never promoted to the job's own tier."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from neffcache.operations import publisher
from neffcache.operations.publisher import Publisher
from neffcache.outcomes import TierProblemKind
from neffcache.replication.tiers import Tiers
from neffcache.signing import PublicKey, SigningKey, generate
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract.sample import publish_a
from neffcache.trust import TrustedKey, TrustPolicy


@pytest.fixture
def signer(tmp_path: Path) -> Iterator[PublicKey]:
    generate(tmp_path / "ci")
    before = publisher.current()
    publisher.use(Publisher(how="warm", signing_key=SigningKey.load(tmp_path / "ci")))
    try:
        yield PublicKey.load(tmp_path / "ci.pub")
    finally:
        publisher.use(before)


def test_a_refused_entry_is_a_miss_in_its_tier_and_never_promoted(tmp_path: Path, signer: PublicKey) -> None:
    shared = LocalStore(tmp_path / "shared")
    good, _ = publish_a(shared, "MODULE_1+abb26765")
    bad, _ = publish_a(shared, "MODULE_2+abb26765")
    # A co-tenant without the key swaps the NEFF and rewrites its digest.
    neff = b"NEFF substitute"
    (tmp_path / "shared" / bad / "model.neff").write_bytes(neff)
    raw = json.loads((tmp_path / "shared" / bad / "neffcache.json").read_bytes())
    raw["files"]["model.neff"] = {"sha256": hashlib.sha256(neff).hexdigest(), "size": len(neff)}
    (tmp_path / "shared" / bad / "neffcache.json").write_text(json.dumps(raw))

    policy = TrustPolicy.of([TrustedKey(signer)], require_signed=True)
    with Tiers([LocalStore(tmp_path / "local"), shared], policy=policy) as chain:
        hit = chain.get_entry(good)
        assert hit is not None and hit.promoted_to == (chain.local.url,)
        assert chain.get_entry(bad) is None
        refused = [p for p in chain.problems if p.kind is TierProblemKind.REFUSED]
        assert [p.path for p in refused] == [bad] and "bad-signature" in refused[0].message
    assert not (tmp_path / "local" / bad).exists()
    # Without a policy (a reader that asked for nothing) the forged digests would pass: the
    # signature is what catches it.
    with Tiers([LocalStore(tmp_path / "local2"), shared]) as chain:
        assert chain.get_entry(bad) is not None
