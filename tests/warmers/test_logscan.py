"""The runtimes' log lines (docs/runtimes.md) read through the layouts, as events on entries."""

from __future__ import annotations

import pytest

from neffcache.errors import ConfigError
from neffcache.layouts import LAYOUTS, LogLine, get_layout
from neffcache.toolchain import Toolchain
from neffcache.warmers.logscan import LogCounter, Pattern, compile_patterns

TC = Toolchain("2.21.33363.0+82129205", "trn1", 1)
ROOT = "/mnt/cache"
NS = [get_layout(n).namespace_for(TC) for n in LAYOUTS]
A_NS = f"trn1-lnc1/neuronxcc-{TC.compiler_version}"
B_NS = f"trn1-lnc1/torchneuron-{TC.compiler_version}"
MODULE = "MODULE_123+abb26765"
ENTRY = f"{A_NS}/{MODULE}"
WORKDIR = "/tmp/ubuntu/neuroncc_compile_workdir/0f3c2a9e-1b7d-4c55-9d1e-6a2b3c4d5e6f"
OP = "aten::add_t0_(3, 3)_float32"


class _Lines:
    """A stand-in for neuronxcc's parser: hands out prepared LogLine values by line text."""

    def __init__(self, table: dict[str, LogLine]) -> None:
        self.table = table

    def __call__(self, line: str) -> LogLine | None:
        return self.table.get(line)


def counter_with(table: dict[str, LogLine], monkeypatch: pytest.MonkeyPatch) -> LogCounter:
    from neffcache.warmers import logscan

    real = logscan._parser
    monkeypatch.setattr(logscan, "_parser", lambda name: _Lines(table) if name == "neuronxcc" else real(name))
    return LogCounter(compile_patterns(), ROOT, NS)


def counter() -> LogCounter:
    return LogCounter(compile_patterns(), ROOT, NS)


def test_native_lines_are_lookups_never_hits_or_misses() -> None:
    """TorchNeuron's HIT and MISS come from an in-process dictionary in front of the disk: a
    MISS is a lookup (a disk hit, or a compile), a HIT a graph the process had. None of its
    lines counts as a hit, a miss or a compile: the caller counts those from the cache."""
    c = counter()
    for line in (f"[NEFF_CACHE] Cache MISS for key: {OP}", f"[NEFF_CACHE] Storing NEFF for key: {OP}",
                 "[NEFF_CACHE] Cache MISS for key: aten::mm_t0_(4, 4)_x",
                 f"[NEFF_CACHE] Cache HIT for key: {OP}", "[NEFF_CACHE] Cache HIT for key: aten::mm_t0_(4, 4)_x",
                 f"[NEFF_CACHE] Cache HIT for key: {OP}"):
        c.feed(line)
    assert c.counts() == {"hit": 0, "miss": 0, "compile": 0, "failure": 0}
    assert c.entries("hit") == [] and c.entries("compile") == []
    assert c.by_namespace() == {}
    assert c.lookups() == {B_NS: 2} and c.reused() == 3
    assert c.unnamed("compile") == {} and c.unnamed("hit") == {}
    assert {e.key for e in c.events} == {OP, "aten::mm_t0_(4, 4)_x"}
    assert c.compiling() == []  # a lookup nothing after names is as likely a disk hit


def test_native_lookup_an_error_line_names_is_where_the_runtime_raised() -> None:
    c = counter()
    c.feed(f"[NEFF_CACHE] Cache MISS for key: {OP}")
    c.feed("[NEFF_CACHE] Cache MISS for key: aten::mm_t0_(4, 4)_x")  # served by the disk
    c.feed("RuntimeError: neuronx-cc failed with exit status 70")  # names no key: nothing known
    assert c.compiling() == []
    c.feed(f"RuntimeError: neuronx-cc failed to compile {OP}: exit status 70")
    assert c.count("failure") == 0  # no failure line exists: nothing is invented
    assert [e.key for e in c.compiling()] == [OP]


def test_layout_a_loglines_map_to_entries_with_compile_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hand-made LogLine values as neuronxcc's parser returns them: work-directory paths outside
    the cache name the entry by its MODULE name."""
    call = f"Call compiler with cmd: neuronx-cc compile {WORKDIR}/model.{MODULE}.hlo_module.pb"
    done = f"Compilation Successfully Completed for model.{MODULE}.hlo_module.pb"
    hit = f"Using a cached neff at {ROOT}/{ENTRY}/model.neff. Exiting with a successfully compiled graph."
    c = counter_with({
        call: LogLine("compile", entry=MODULE, path=f"{WORKDIR}/model.{MODULE}.hlo_module.pb"),
        done: LogLine("success", entry=MODULE),
        hit: LogLine("hit", entry=MODULE, path=f"{ROOT}/{ENTRY}/model.neff"),
    }, monkeypatch)
    c.feed(call, at=100.0)
    c.feed(done, at=142.5)
    c.feed(hit, at=150.0)
    assert c.counts() == {"hit": 1, "miss": 1, "compile": 1, "failure": 0}
    assert c.entries("compile") == c.entries("miss") == c.entries("hit") == [ENTRY]
    assert c.compile_seconds(ENTRY) == 42.5
    assert c.by_namespace()[A_NS]["compile"] == 1 and c.compiling() == []


def test_layout_a_failure_lines_count_once_and_time_the_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    call, failed, gave_up = "call", "Failed compilation with [...]", "Compilation failed for ... after 0 retries."
    c = counter_with({call: LogLine("compile", entry=MODULE), failed: LogLine("failure", entry=MODULE),
                      gave_up: LogLine("failure", entry=MODULE)}, monkeypatch)
    c.feed(call, at=10.0)
    c.feed(failed, at=13.0)
    c.feed(gave_up, at=13.1)
    assert c.counts() == {"hit": 0, "miss": 1, "compile": 1, "failure": 1}
    assert c.entries("failure") == [ENTRY] and c.compile_seconds(ENTRY) == 3.0


def test_entry_names_are_checked_by_the_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    c = counter_with({"x": LogLine("compile", entry="MODULE_../../etc"), "y": LogLine("hit", entry="nope")},
                     monkeypatch)
    c.feed("x")
    c.feed("y")
    assert c.count("miss") == 1 and c.count("hit") == 1 and c.entries("compile") == c.entries("hit") == []


def test_paths_outside_the_root_count_but_name_no_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    line = "elsewhere"
    c = counter_with({line: LogLine("hit", path=f"/elsewhere/neuronxcc-2.21/{MODULE}/model.neff")}, monkeypatch)
    c.feed(line)
    assert c.count("hit") == 1 and c.entries("hit") == []


def test_a_pattern_with_a_path_group_reads_cache_paths() -> None:
    c = LogCounter(compile_patterns([r"hit=cache hit (?P<path>\S+)"], defaults=False), ROOT, NS)
    c.feed(f"cache hit {ROOT}/{ENTRY}/model.neff")
    c.feed(f"[NEFF_CACHE] Cache HIT for key: {OP}")  # the layouts' lines are off
    assert c.count("hit") == 1 and c.entries("hit") == [ENTRY]


def test_user_patterns_add_to_the_layouts() -> None:
    patterns = compile_patterns([r"failure=FATAL: (?P<key>\S+)"])
    assert [p.layout for p in patterns if p.regex is None] == list(LAYOUTS)
    c = LogCounter(patterns, ROOT, NS)
    c.feed("FATAL: graph7")
    c.feed(f"[NEFF_CACHE] Cache HIT for key: {OP}")  # the process had it: a reuse, not a cache hit
    assert c.counts() == {"hit": 0, "miss": 0, "compile": 0, "failure": 1} and c.reused() == 1


def test_no_layout_parses_an_invented_native_failure_line() -> None:
    c = counter()
    c.feed(f"[NEFF_CACHE] Compilation FAILED for key: {OP}")
    assert c.events == []


@pytest.mark.parametrize("spec", ["hit", "bogus=x", "hit=(", "success=x"])
def test_bad_patterns(spec: str) -> None:
    with pytest.raises(ConfigError, match="pattern"):
        compile_patterns([spec])


def test_pattern_reads_groups() -> None:
    import re

    p = Pattern("hit", re.compile(r"got (?P<entry>MODULE_\S+)"))
    assert p.read("got MODULE_1+abcdef12") == LogLine("hit", entry="MODULE_1+abcdef12")


def test_real_layout_a_line_forms() -> None:
    """Every libneuronxla line form of docs/runtimes.md "The neuronxcc layout", through whichever parser neuronxcc has
    (the transitional one in warmers/_legacy_lines.py until the layout's own lands)."""
    stamp = "2026-01-01 10:00:00.000000:  42  "
    wd = f"{WORKDIR}/model.{MODULE}"
    other = "MODULE_9876543210+e30acd3a"
    lines = [
        (0.0, f"{stamp}INFO ||NEURON_CC_WRAPPER||: Using a cached neff at {ROOT}/{A_NS}/{other}/model.neff. "
              "Exiting with a successfully compiled graph."),
        (1.0, f"{stamp}INFO ||NEURON_CC_WRAPPER||: Call compiler with cmd: neuronx-cc compile --framework=XLA "
              f"{wd}.hlo_module.pb --output {wd}.neff --target=trn1 --model-type=transformer --verbose=35"),
        (4.0, f"{stamp}INFO ||NEURON_CC_WRAPPER||: Compilation Successfully Completed for "
              f"model.{MODULE}.hlo_module.pb"),
        # The pre-2024 list form with .hlo.pb, then a failure of the same graph reported twice.
        (5.0, f"{stamp}INFO ||NEURON_CC_WRAPPER||: Call compiler with cmd: ['neuronx-cc', 'compile', "
              f"'--framework=XLA', '{WORKDIR}/model.{other}.hlo.pb', '--output', '{WORKDIR}/model.{other}.neff']"),
        (7.0, f"{stamp}ERROR ||NEURON_CC_WRAPPER||: Failed compilation with ['neuronx-cc', 'compile', "
              f"'{WORKDIR}/model.{other}.hlo.pb']: exit status 70"),
        (7.1, f"{stamp}ERROR ||NEURON_CC_WRAPPER||: Compilation failed for {WORKDIR}/model.{other}.hlo.pb "
              "after 0 retries."),
        (8.0, f"{stamp}ERROR ||NEURON_CC_WRAPPER||: Got a cached failed neff at {ROOT}/{A_NS}/MODULE_5+d41d8cd9/"
              "model.neff. Will skip compilation, please set --retry_failed_compilation for recompilation."),
    ]
    c = counter()
    for at, line in lines:
        c.feed(line, at=at)
    assert c.counts() == {"hit": 1, "miss": 2, "compile": 2, "failure": 2}
    assert c.entries("compile") == [ENTRY, f"{A_NS}/{other}"]
    assert c.entries("failure") == [f"{A_NS}/{other}", f"{A_NS}/MODULE_5+d41d8cd9"]
    assert c.entries("hit") == [f"{A_NS}/{other}"]
    assert c.compile_seconds(ENTRY) == 3.0 and c.compile_seconds(f"{A_NS}/{other}") == 2.0
