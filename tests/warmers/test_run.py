"""`neffcache run -- CMD`: output through unchanged, counts from the log lines, publish, stamps,
signals forwarded, the job's exit code."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from neffcache.coordination.stamps import last_used
from neffcache.stores import open_store
from tests.warmers.conftest import INSTANCE, WORKLOAD, Cli, Index, healthy

TRAIN = (*WORKLOAD, "--model", "llama-tiny", "--bucket", "128", "--graphs", "3", "--steps", "3")


def _run(cli: Cli, store: Path, *extra: str, command: tuple[str, ...] = TRAIN, **env: str) -> tuple[int, str, str]:
    # A "training job": not compile-only, so it runs its steps after loading its graphs.
    proc = cli.run("run", "--instance", INSTANCE, "--store", str(store), *extra, "--", *command,
                   TORCH_NEURONX_COMPILE_ONLY="", **env)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("backend", ["xla", "native"])
def test_run_wraps_a_training_job(cli: Cli, tmp_path: Path, index: Index, backend: str) -> None:
    store, second = tmp_path / "nvme", tmp_path / "fsx"
    report = tmp_path / "report.json"
    job = (*TRAIN, "--backend", backend)
    rc, out, err = _run(cli, store, "--store", str(second), "--report", str(report), "--tag", "team=llm",
                        command=job)
    assert rc == 0, err
    assert out == "step 1/3: loss=2.0000 (simulated)\nstep 2/3: loss=1.3333 (simulated)\n" \
                  "step 3/3: loss=1.0000 (simulated)\n"  # stdout untouched
    assert "SIMULATED torch-neuronx workload" in err  # the job's stderr passes through too
    counts = json.loads(report.read_text())
    assert (counts["hit"], counts["miss"], counts["compile"], counts["failure"], counts["published"]) == \
        (0, 3, 3, 0, 3)
    # What the job compiled now has a manifest, and went to the second tier.
    for root in (store, second):
        entries = healthy(root).entries
        assert len(entries) == 3 and all(e.manifest and e.manifest.tags["team"] == "llm" for e in entries)

    rc, out2, err2 = _run(cli, store, "--report", str(report), command=job)
    assert rc == 0 and out2 == out
    assert json.loads(report.read_text())["hit"] == 3 and "3 hits" in err2
    # Hits stamped for age-based pruning; TorchNeuron's hit lines name an op key, not an entry,
    # so its hits cannot be stamped (its entries age by creation time).
    assert len(last_used(open_store(str(store)))) == (3 if backend == "xla" else 0)
    totals = index.stats()["totals"]
    assert (totals["hits"], totals["compiles"]) == (3, 3)
    assert len(cli.sim.compiles()) == 3


def test_run_exits_with_the_jobs_code_and_counts_failures(cli: Cli, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    rc, _, err = _run(cli, tmp_path / "s", "--report", str(report), command=(*TRAIN, "--crash-after", "1"))
    assert rc == 3 and "exit 3" in err
    rc, _, _ = _run(cli, tmp_path / "s", "--report", str(report), NEFFSIM_FAIL_MATCH="g2")
    assert rc == 1 and json.loads(report.read_text())["failure"] == 1
    rc, _, err = _run(cli, tmp_path / "s", command=("no-such-command-here",))
    assert rc == 127 and "no-such-command-here" in err


@pytest.mark.s3
def test_run_prefetches_from_a_remote_tier(cli: Cli, tmp_path: Path, s3: str) -> None:
    assert _run(cli, tmp_path / "host-a", "--store", s3, "--tag", "model=llama-tiny")[0] == 0
    report = tmp_path / "r.json"
    rc, _, err = _run(cli, tmp_path / "host-c", "--store", s3, "--prefetch-tag", "model=other", "--no-publish",
                      "--report", str(report))
    assert rc == 0 and json.loads(report.read_text())["prefetched"] == 0, err  # no entry has that tag
    rc, _, err = _run(cli, tmp_path / "host-b", "--store", s3, "--prefetch", "--report", str(report))
    assert rc == 0, err
    counts = json.loads(report.read_text())
    assert (counts["prefetched"], counts["hit"], counts["compile"]) == (3, 3, 0)


def test_signals_reach_the_job(cli: Cli, tmp_path: Path) -> None:
    script = ("import signal, sys, time\n"
              "def bye(signum, frame):\n"
              "    print('got', signal.Signals(signum).name, flush=True); sys.exit(42)\n"
              "signal.signal(signal.SIGTERM, bye)\n"
              "print('ready', flush=True)\n"
              "time.sleep(60)\n")
    proc = cli.popen("run", "--instance", INSTANCE, "--store", str(tmp_path / "s"), "--", sys.executable, "-c", script)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 42 and out == "got SIGTERM\n"


def test_run_clears_a_failure_the_host_caused_so_the_next_job_compiles_it(cli: Cli, tmp_path: Path) -> None:
    """The runtime records an OOM-killed compile as a failure like any other; left there, every
    later job on the root would skip the graph for ever. `run` judges what its job recorded
    and removes the logs that do not stand (docs/warmers.md); a real compiler error stays."""
    store, report = tmp_path / "s", tmp_path / "r.json"
    rc, _, err = _run(cli, store, "--report", str(report), NEFFSIM_OOM_MATCH="g2")
    assert rc == 1 and json.loads(report.read_text())["failure"] == 1
    assert "cleared 1 failure the host caused" in err
    assert not list(store.rglob("model.log"))  # the OOM is not cached
    rc, _, err = _run(cli, store, "--report", str(report))  # the next job compiles g2 and succeeds
    assert rc == 0, err
    assert json.loads(report.read_text())["compile"] == 1

    rc, _, err = _run(cli, tmp_path / "c", NEFFSIM_FAIL_MATCH="g2")
    assert rc == 1 and "cleared" not in err
    assert len(list((tmp_path / "c").rglob("model.log"))) == 1  # a compiler error stands
    rc, _, _ = _run(cli, tmp_path / "c")
    assert rc == 1  # and the runtime skips it, as it would without neffcache
