"""Ctrl-C and SIGTERM: every child process group stops, the cache stays consistent, leases are released."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.warmers.conftest import Cli, healthy, warm_args
from tests.warmers.test_failures import _no_compiler_left


@pytest.mark.parametrize(("sig", "mode"), [(signal.SIGINT, []), (signal.SIGTERM, ["--two-phase"])],
                         ids=["sigint-one-phase", "sigterm-two-phase"])
def test_a_signal_stops_everything_and_leaves_the_cache_consistent(cli: Cli, tmp_path: Path, sig: int,
                                                                   mode: list[str]) -> None:
    store = tmp_path / "store"
    proc = cli.popen(*warm_args(store, "--parallel", "2", *mode, graphs=3), NEFFSIM_HANG_MATCH="g1")
    deadline = time.monotonic() + 30
    while not any(str(r["graph"]).endswith("/g1") for r in cli.sim.compiles()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err
    assert "consistent" in err
    _no_compiler_left(cli)
    healthy(store)
    assert not list((store / ".neffcache").rglob("*.lease"))
