"""The failure log's form is a runtime fact: neuronxcc reads libneuronxla's ``Failed compilation
with [<command>]: <stderr>`` and writes the same, so a runtime and neffcache read each other's."""

from __future__ import annotations

import pytest

from neffcache.layouts import LAYOUTS, get_layout

LAYOUT_A = get_layout("neuronxcc")


def test_layout_a_reads_what_it_writes() -> None:
    command = ["neuronx-cc", "compile", "--framework=XLA", "/tmp/a]b: c/model.pb", "--target=trn2", "--lnc=2"]
    data = LAYOUT_A.failure_log_bytes(command, "ERROR: boom\nCompiler status ERROR\n")
    got = LAYOUT_A.read_failure_log(data)
    assert got.command == tuple(command)
    assert got.output == "ERROR: boom\nCompiler status ERROR\n"


def test_layout_a_reads_the_runtimes_own_form_written_without_neffcache() -> None:
    # As the simulated runtime (neffcache.testing.xla_cache) and tests/runtime_caches.py write it.
    cmd = ["neuronx-cc", "compile", "--framework=XLA", "/tmp/u/w/model.MODULE_1+ab.hlo_module.pb", "--output",
           "/tmp/u/w/model.MODULE_1+ab.neff", "--target=trn2", "--lnc=2", "--verbose=35"]
    got = LAYOUT_A.read_failure_log(f"Failed compilation with {cmd!r}: exit status -9\n".encode())
    assert got.command == tuple(cmd) and got.output == "exit status -9\n"
    legacy = LAYOUT_A.read_failure_log(b"Failed compilation with ['neuronx-cc', 'compile']: internal error\n")
    assert legacy.command == ("neuronx-cc", "compile") and legacy.output == "internal error\n"


@pytest.mark.parametrize("data", [
    b"ERROR: compilation failed: internal error\n",  # no wrapper prefix: the text as it is
    b"Failed compilation with [unclosed: ERROR x",
    b"Failed compilation with [1, 2]: ERROR x",  # not a list of strings
    b"Failed compilation with [__import__('os').system('true')]: ERROR x",  # never evaluated
    b"Failed compilation with " + b"[" * 100_000,
    b"\xff\xfe not utf-8 \x00",
])
def test_a_log_of_another_form_is_its_text(data: bytes) -> None:
    got = LAYOUT_A.read_failure_log(data)
    assert got.command is None and got.output == data.decode(errors="replace")


def test_layouts_without_failure_logs_read_text_as_is() -> None:
    for layout in LAYOUTS.values():
        assert layout.read_failure_log(b"x").output == "x"
