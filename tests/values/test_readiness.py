"""The readiness rule (neffcache/readiness.py): hit-weighted, with a floor for unused graphs."""

from __future__ import annotations

import pytest

from neffcache.keys import cache_key, key_of_digest
from neffcache.readiness import UNUSED_WEIGHT, graph_weight, readiness
from neffcache.toolchain import Toolchain, version_key


def test_weights_are_hits_plus_the_floor() -> None:
    assert graph_weight(0) == UNUSED_WEIGHT == 0.1
    assert graph_weight(7) == pytest.approx(7.1)


def test_readiness_from_sums() -> None:
    # hits 5 and 3 ready, 2 and 0 not: (5.1 + 3.1) / (5.1 + 3.1 + 2.1 + 0.1)
    assert readiness(4, 10, 2, 8) == pytest.approx(8.2 / 10.4)
    assert readiness(3, 0, 1, 0) == pytest.approx(1 / 3)  # no hits: the plain share
    assert readiness(2, 1000, 2, 1000) == 1.0
    assert readiness(0, 0, 0, 0) is None  # nothing to be ready for


def test_an_unused_graph_counts_a_little() -> None:
    hot_missing = readiness(11, 100, 10, 0)  # ten unused graphs ready, the one hot graph missing
    assert hot_missing is not None and hot_missing < 0.02


def test_key_of_digest_is_the_key_of_the_bytes() -> None:
    import hashlib

    tc = Toolchain("2.27.5334.0+f702b353", "trn2", 2)
    hlo = b"HLO bytes"
    digest = hashlib.sha256(hlo).hexdigest()
    assert key_of_digest(digest, ["-O2", "--lnc=2"], tc) == cache_key(hlo, ["--lnc=2", "-O2"], tc)


def test_compiler_versions_order_numerically() -> None:
    assert sorted(["2.10.1.0+a", "2.9.5.0+b", "2.27.5334.0+f702b353"], key=version_key) == [
        "2.9.5.0+b", "2.10.1.0+a", "2.27.5334.0+f702b353"]
