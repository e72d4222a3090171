"""WantedGraph round-trips through JSON and refuses a hostile report field by field."""

from __future__ import annotations

import pytest

from neffcache.errors import ConfigError
from neffcache.misses.wanted import WantedGraph
from neffcache.toolchain import Toolchain

GRAPH = WantedGraph(path="trn2-lnc2/neuronxcc-2.21.33363.0+82129205/MODULE_1+e30acd3a", layout="neuronxcc",
                    namespace="trn2-lnc2/neuronxcc-2.21.33363.0+82129205", key="MODULE_1+e30acd3a",
                    toolchain=Toolchain("2.21.33363.0+82129205", "trn2", 2), hlo_sha256="a" * 64, hlo_size=1234,
                    flags=("--model-type=transformer",), bucket="SEQ=128", tags={"model": "llama"})


def test_a_graph_survives_its_json() -> None:
    assert WantedGraph.from_json(GRAPH.to_json()) == GRAPH


def test_unknown_parts_stay_unknown() -> None:
    bare = WantedGraph(path="ns/k", layout="neuronxcc", namespace="ns", key="k")
    assert WantedGraph.from_json(bare.to_json()) == bare


@pytest.mark.parametrize(("field", "value", "says"), [
    ("path", "../../etc/passwd", "'..'"),
    ("path", "/abs/path", "absolute"),
    ("path", 7, "'path'"),
    ("hlo_sha256", "A" * 64, "hlo_sha256"),
    ("hlo_size", float("nan"), "hlo_size"),
    ("hlo_size", -1, "hlo_size"),
    ("hlo_size", True, "hlo_size"),
    ("flags", "--a --b", "flags"),
    ("flags", [1, 2], "flags"),
    ("toolchain", {"compiler_version": "2.21.0.0", "target": "trn9", "lnc": 2}, "trn9"),
    ("toolchain", {"target": "trn2", "lnc": 2}, "compiler_version"),
    ("tags", {"model": 3}, "tags"),
])
def test_a_bad_field_is_named(field: str, value: object, says: str) -> None:
    data = {**GRAPH.to_json(), field: value}
    with pytest.raises(ConfigError, match=says):
        WantedGraph.from_json(data)


def test_a_report_entry_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ConfigError, match="not an object"):
        WantedGraph.from_json(["path"])
