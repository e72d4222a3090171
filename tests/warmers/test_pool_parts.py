"""Small parts of the compile machinery: the memory gate, the watchdog's view of a compiler."""

from __future__ import annotations

import pytest

from neffcache.warmers.memory import MemoryGate, available_bytes
from neffcache.warmers.watchdog import compiler_input


def test_the_memory_gate_always_admits_one_compile() -> None:
    huge = MemoryGate(per_compile_mb=1 << 30)  # a petabyte per compile
    assert huge.room_for_another(0)
    if available_bytes() is not None:
        assert not huge.room_for_another(1)
    assert MemoryGate(per_compile_mb=1).room_for_another(3)
    assert MemoryGate().estimate() >= 0  # learned from the children seen so far


@pytest.mark.parametrize(("argv", "expected"), [
    (["/usr/bin/python3", "/opt/aws/bin/neuronx-cc", "compile", "--framework=XLA", "--target=trn2", "/c/m.pb",
      "--output", "/c/m.neff"], "/c/m.pb"),
    (["python", "-m", "neffcache.testing.compiler", "compile", "/c/k.hlo_module.pb", "--framework", "XLA",
      "--target", "trn2", "--output", "/c/k.neff"], "/c/k.hlo_module.pb"),
    (["/bin/sh", "/tmp/bin/neuronx-cc", "compile", "--lnc", "2", "/w/x.pb"], "/w/x.pb"),
    (["/usr/bin/python3", "/opt/aws/bin/neuronx-cc", "--version"], None),
    (["python", "train.py", "compile"], None),
])
def test_the_watchdog_recognises_compiler_command_lines(argv: list[str], expected: str | None) -> None:
    assert compiler_input(argv) == expected
