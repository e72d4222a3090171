"""`neffcache demo` (the README's first command) runs end to end and checks itself, and the
dashboard hint it ends with runs as printed."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import free_port
from tests.warmers.conftest import Cli

pytestmark = pytest.mark.slow


def test_the_demo_runs_and_its_checks_pass(cli: Cli, tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    proc = cli.run("demo", "--workdir", str(workdir), "--compile-seconds", "0.05", timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "SIMULATED" in out
    assert "warm again" in out and "16 hits, 0 misses, 0 compiles" in proc.stdout
    # The jobs hit everything: warm-up and rewarm compiles are shown apart, not as misses.
    assert "hit rate        100.0%" in out and "compiled ahead of demand" in out
    assert "!!" not in out

    last = out.strip().splitlines()[-1]
    assert last.startswith("dashboard: the index stopped with the demo; browse it with: neffcache serve ")
    argv = shlex.split(last.split("browse it with: ", 1)[1].split("   (then open", 1)[0])
    port = free_port()  # the printed command on a free port (the default may be taken here)
    server = subprocess.Popen(cli.argv(*argv[1:], "--port", str(port)), env=cli.environ(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except httpx.TransportError:
                assert server.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        assert page.status_code == 200 and "job hit rate" in page.text  # the dashboard, not a login page
        stats = httpx.get(f"http://127.0.0.1:{port}/v1/stats", params={"window": "1h"}).json()
        assert stats["hit_rate"] == 1.0 and stats["warm_ups"]["compiles"] > 0, json.dumps(stats["totals"])
    finally:
        server.terminate()
        server.wait(timeout=30)

    rerun = cli.run("demo", "--workdir", str(workdir), "--compile-seconds", "0.05", timeout=180)
    assert rerun.returncode == 0, rerun.stderr[-2000:]  # its own workdir: replaced, not refused
