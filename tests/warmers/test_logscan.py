"""The runtimes' log lines (NEURON_FACTS.md §2) read as events on entries."""

from __future__ import annotations

import pytest

from neffcache.errors import ConfigError
from neffcache.layouts import get_layout
from neffcache.toolchain import Toolchain
from neffcache.warmers.logscan import LogCounter, compile_patterns

TC = Toolchain("2.21.33363.0+82129205", "trn1", 1)
ROOT = "/mnt/cache"
NS = [get_layout(n).namespace_for(TC) for n in ("neuronxcc", "torchneuron")]
MOD = f"{ROOT}/trn1-lnc1/neuronxcc-2.21.33363.0+82129205/MODULE_123+abb26765"
KEY = "ab" * 32


def counter() -> LogCounter:
    return LogCounter(compile_patterns(), ROOT, NS)


def test_layout_a_lines() -> None:
    c = counter()
    c.feed(f"2026-01-01 10:00:00.000000:  42  INFO ||NEURON_CC_WRAPPER||: Using a cached neff at {MOD}/model.neff. "
           "Exiting with a successfully compiled graph.")
    c.feed("INFO ||NEURON_CC_WRAPPER||: Call compiler with cmd: neuronx-cc compile --target=trn1 --framework=XLA "
           f"{MOD}/model.hlo_module.pb --output {MOD}/model.neff --model-type=transformer --verbose=35")
    c.feed("ERROR ||NEURON_CC_WRAPPER||: Failed compilation with "
           f"['neuronx-cc', 'compile', '{MOD}/model.hlo_module.pb']")
    c.feed(f"Got a cached failed neff at {MOD}/model.neff. Will skip compilation, please set "
           "--retry_failed_compilation for recompilation")
    assert c.counts() == {"hit": 1, "miss": 1, "compile": 1, "failure": 2}
    entry = "trn1-lnc1/neuronxcc-2.21.33363.0+82129205/MODULE_123+abb26765"
    assert c.entries("hit") == c.entries("compile") == c.entries("failure") == [entry]


def test_native_lines_map_keys_to_entries() -> None:
    c = counter()
    for line in (f"[NEFF_CACHE] Cache MISS for key: {KEY}", f"[NEFF_CACHE] Storing NEFF for key: {KEY}",
                 f"[NEFF_CACHE] Cache HIT for key: {KEY}", f"[NEFF_CACHE] Compilation FAILED for key: {KEY}: x"):
        c.feed(line)
    assert c.counts() == {"hit": 1, "miss": 1, "compile": 1, "failure": 1}
    assert c.entries("hit") == [f"trn1-lnc1/torchneuron-2.21.33363.0+82129205/neff/ab/ab/{KEY}"]


def test_paths_outside_the_root_count_but_name_no_entry() -> None:
    c = counter()
    c.feed("Using a cached neff at /elsewhere/neuronxcc-2.21.33363.0+82129205/MODULE_1+d41d8cd9/model.neff. Exiting")
    assert c.count("hit") == 1 and c.entries("hit") == []


def test_custom_patterns() -> None:
    c = LogCounter(compile_patterns([r"hit=cache hit (?P<path>\S+)"], defaults=False), ROOT, NS)
    c.feed(f"cache hit {MOD}/model.neff")
    c.feed(f"Using a cached neff at {MOD}/model.neff.")  # defaults are off
    assert c.count("hit") == 1


@pytest.mark.parametrize("spec", ["hit", "bogus=x", "hit=("])
def test_bad_patterns(spec: str) -> None:
    with pytest.raises(ConfigError, match="pattern"):
        compile_patterns([spec])
