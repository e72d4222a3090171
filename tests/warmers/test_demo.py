"""`neffcache demo` (the README's first command) runs end to end and checks itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.warmers.conftest import Cli

pytestmark = pytest.mark.slow


def test_the_demo_runs_and_its_checks_pass(cli: Cli, tmp_path: Path) -> None:
    proc = cli.run("demo", "--workdir", str(tmp_path / "demo"), "--compile-seconds", "0.05", timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "SIMULATED" in out
    assert "warm again" in out and "16 hits, 0 misses, 0 compiles" in proc.stdout
    assert "dashboard: http://127.0.0.1:" in out
    assert "!!" not in out
