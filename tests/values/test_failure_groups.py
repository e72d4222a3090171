"""neffcache.failure_groups: sightings grouped by signature, groups of two sources merged, groups
read back from the index checked, signature prefixes resolved."""

from __future__ import annotations

import math

import pytest

from neffcache.failure_groups import (
    MAX_PATHS,
    FailureGroup,
    SeenIn,
    group_sightings,
    merge_groups,
    resolve_signature,
    sighting,
    version_of_label,
)
from neffcache.failures import FailureCause, FailureClass


def _error(path: str, line: int) -> str:
    return f"ERROR:neuronxcc: [NCC_E042] a tensor of {line} bytes does not fit at {path}:{line}\nCompiler status ERROR"


def test_sightings_of_one_error_on_several_hosts_are_one_group() -> None:
    seen = [
        sighting(_error("/tmp/a/x.pb", 3), seen=100.0, path="ns/MODULE_1+aa", source=SeenIn.STORE,
                 compiler_version="2.27", store="file:///a"),
        sighting(_error("/fsx/b/y.pb", 99), seen=300.0, path="ns/MODULE_2+aa", source=SeenIn.INDEX,
                 compiler_version="2.28", model="llama", team="ml"),
        sighting(_error("/fsx/b/y.pb", 99), seen=200.0, path="ns/MODULE_2+aa", source=SeenIn.INDEX, model="llama"),
        sighting("neuronx-cc: error while loading shared libraries: libfoo.so.1: cannot open shared object file",
                 seen=50.0, path=None, source=SeenIn.INDEX, team="infra"),
    ]
    groups = group_sightings(seen)
    assert len(groups) == 2
    big, env = groups
    assert (big.graphs, big.occurrences, big.first_seen, big.last_seen) == (2, 3, 100.0, 300.0)
    assert big.failure_class is FailureClass.COMPILER and big.compiler_versions == ["2.27", "2.28"]
    assert big.models == ["llama"] and big.teams == ["ml"] and big.sources == ["index", "store"]
    assert big.sample["store"] == "file:///a"  # a store's sample first: a bundle can be made from it
    assert env.cause is FailureCause.MISSING_LIBRARY and env.failure_class is FailureClass.ENVIRONMENT
    assert env.graphs == 1 and env.paths == []


def test_merging_counts_a_graph_both_sources_know_once() -> None:
    a = group_sightings([sighting(_error("/a", 1), seen=10.0, path=f"p{i}", source=SeenIn.STORE) for i in range(3)])
    b = group_sightings([sighting(_error("/b", 2), seen=20.0, path=f"p{i}", source=SeenIn.INDEX, team="t")
                         for i in range(2, 5)])
    (merged,) = merge_groups(a, b)
    assert merged.graphs == 5 and merged.occurrences == 6
    assert (merged.first_seen, merged.last_seen, merged.teams) == (10.0, 20.0, ["t"])
    assert merged.sample["source"] == "store"


def test_a_group_survives_json_and_a_forged_one_is_refused() -> None:
    (group,) = group_sightings([sighting(_error("/a", 1), seen=10.0, path="p", source=SeenIn.STORE)])
    back = FailureGroup.from_json(group.to_json())
    assert back.to_json() == group.to_json()
    for bad in ({"signature": "../../etc"}, {"graphs": -1}, {"graphs": True}, {"last_seen": math.nan},
                {"cause": "made-up"}, {"models": "llama"}):
        with pytest.raises(ValueError):
            FailureGroup.from_json({**group.to_json(), **bad})
    many = FailureGroup.from_json({**group.to_json(), "paths": [f"p{i}" for i in range(10 * MAX_PATHS)]})
    assert len(many.paths) == MAX_PATHS


def test_a_signature_prefix_resolves_when_unique() -> None:
    known = ["3f2a9c1e00000001", "3f2a9c1e00000002", "0123456789abcdef"]
    assert resolve_signature("0123", known) == "0123456789abcdef"
    assert resolve_signature("3F2A9C1E00000002", known) == "3f2a9c1e00000002"
    with pytest.raises(ValueError, match="ambiguous"):
        resolve_signature("3f2a", known)
    with pytest.raises(ValueError, match="no failure"):
        resolve_signature("ffff", known)
    for bad in ("01", "zzzz", "../x", "0123456789abcdef0"):
        with pytest.raises(ValueError, match="not a signature"):
            resolve_signature(bad, known)


def test_version_of_an_index_toolchain_label() -> None:
    assert version_of_label("trn2-lnc2/neuronxcc-2.27.5334.0+f702b353") == "2.27.5334.0+f702b353"
    assert version_of_label("unknown") is None and version_of_label(None) is None
