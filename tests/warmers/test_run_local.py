"""`neffcache run --local DIR` (issue 36): prefetch into a node-local tier, the job against it, write
back while it runs and after, one report; every entry published once, with one manifest.

Real processes throughout. Order, not time, is asserted: a job that waits for its own entries to
reach the shared tier before it exits proves the write-back published them during the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from neffcache.entry import EntryState
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from tests.warmers.conftest import INSTANCE, WORKLOAD, Cli, Index, healthy, warm_args
from tests.warmers.test_vllm_warm import NS as VLLM_NS
from tests.warmers.test_vllm_warm import SERVER, vllm_warm_args

TRAIN = (*WORKLOAD, "--model", "llama-tiny", "--bucket", "128", "--graphs", "3", "--steps", "2")
# Waits until DIR's committed entries below a namespace prefix are all committed in SHARED too:
# a job that exits only once the write-back has published what it compiled.
WAIT_FOR_WRITE_BACK = """
import sys, time
from neffcache.entry import EntryState
from neffcache.layouts import entry_forms
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
local, shared, want = LocalStore(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for _ in range(1200):
    mine = [e.path for e in scan(local).entries if e.state is EntryState.SUCCESS and e.manifest_name in e.files
            and e.toolchain is not None]
    there = {e.path for e in scan(LocalStore(shared)).entries if e.state is EntryState.SUCCESS} if \\
        __import__("os").path.isdir(shared) else set()
    if len(mine) >= want and all(set(entry_forms(p)) & there for p in mine):
        print("written back during the run", flush=True)
        sys.exit(0)
    time.sleep(0.1)
sys.exit("the write-back never published the job's entries")
"""


def _run(cli: Cli, local: Path, shared: Path, report: Path, *extra: str, command: tuple[str, ...] = TRAIN,
         rc: int = 0, **env: str) -> dict[str, Any]:
    proc = cli.run("run", "--instance", INSTANCE, "--local", str(local), "--store", str(shared), "--report",
                   str(report), *extra, "--", *command, TORCH_NEURONX_COMPILE_ONLY="", **env)
    assert proc.returncode == rc, proc.stderr
    data: dict[str, Any] = json.loads(report.read_text())
    data["stderr"], data["stdout"] = proc.stderr, proc.stdout
    return data


def test_after_a_warm_the_job_on_the_prefetched_tier_compiles_nothing(cli: Cli, tmp_path: Path) -> None:
    shared, local, report = tmp_path / "shared", tmp_path / "nvme", tmp_path / "r.json"
    cli.json(*warm_args(shared, buckets="128", graphs=3))
    before = len(cli.sim.compiles())
    got = _run(cli, local, shared, report)
    assert (got["prefetched"], got["hit"], got["compile"], got["published"]) == (3, 3, 0, 0), got["stderr"]
    assert got["prefetch"]["ok"] and got["prefetch"]["copied"] == 3
    assert got["write_back"]["published"] == 0 and got["write_back"]["drained"] is True
    assert got["env"]["NEURON_COMPILE_CACHE_URL"].startswith(str(local))
    assert len(cli.sim.compiles()) == before
    assert "wrote back 0 entries" in got["stderr"]


def test_what_the_job_compiles_is_written_back_during_the_run_with_the_runs_manifest(
        cli: Cli, tmp_path: Path, index: Index) -> None:
    """The write-back publishes while the job still runs; afterwards `run` publishes the same
    entries again (every tier) and reports them: one manifest per entry, the run's tags and
    compile seconds in it, one compile event per graph."""
    shared, local, report = tmp_path / "shared", tmp_path / "nvme", tmp_path / "r.json"
    script = tmp_path / "wait.py"
    script.write_text(WAIT_FOR_WRITE_BACK)
    job = ("sh", "-c", f"{' '.join(TRAIN)} && {sys.executable} {script} {local} {shared} 3")
    got = _run(cli, local, shared, report, "--tag", "team=llm", command=job, NEFFSIM_COMPILE_SECONDS="0.3")
    assert "written back during the run" in got["stdout"], got["stderr"]
    assert (got["miss"], got["compile"], got["published"]) == (3, 3, 3), got["stderr"]
    assert got["write_back"]["published"] == 3 and got["write_back"]["lag_p50"] is not None
    mine = {e.path: e for e in scan(LocalStore(local), read_manifests=True).entries}
    for entry in healthy(shared).entries:
        manifest = entry.manifest
        assert manifest is not None and manifest.tags["team"] == "llm" and not manifest.computed
        assert manifest.compile_seconds is not None and manifest.compile_seconds >= 0.3
        assert manifest.compile_seconds == got["compile_seconds"][entry.path]
        # The very manifest the run wrote into the node-local tier: published once, never twice.
        assert (shared / entry.path / entry.manifest_name).read_bytes() == \
            (local / entry.path / entry.manifest_name).read_bytes()
        assert mine[entry.path].manifest == manifest
    totals = index.stats()["totals"]
    assert (totals["hits"], totals["misses"], totals["compiles"]) == (0, 3, 3)
    # A second pod: everything prefetched, nothing compiled, nothing published twice.
    again = _run(cli, tmp_path / "nvme2", shared, report)
    assert (again["prefetched"], again["hit"], again["compile"]) == (3, 3, 0)
    assert index.stats()["totals"]["compiles"] == 3


def test_vllm_compiles_are_written_back_and_its_own_fetches_are_hits(cli: Cli, tmp_path: Path) -> None:
    """vLLM-Neuron prints no line per graph: its compiles are the entries DIR gained, less those
    it fetched itself from the shared tier (a prefetch budget of one byte leaves it to)."""
    shared, local, report = tmp_path / "shared", tmp_path / "nvme", tmp_path / "r.json"
    cli.json(*vllm_warm_args(shared, buckets="128"))
    server = (*SERVER, "--model", "llama-tiny", "--bucket", "128,256", "--graphs", "2", "--exit-when-ready")
    got = _run(cli, local, shared, report, "--prefetch-max-bytes", "1", command=server,
               NEFFSIM_VLLM_DEVICE=INSTANCE)
    assert got["prefetched"] == 0 and got["prefetch"]["over_budget"] == 2
    assert (got["hit"], got["compile"], got["published"]) == (2, 2, 2), got["stderr"]
    assert got["env"]["VLLM_CACHE_ROOT"].startswith(str(local))
    assert got["env"]["NEURON_LIBTORCH_REMOTE_CACHE"] == str(shared / VLLM_NS)
    flat = [e for e in healthy(shared).entries if e.layout == "vllm"]
    assert len(flat) == 4 and all(e.path == f"{VLLM_NS}/{e.key}" for e in flat)
    # The next pod prefetches all four into vLLM's local form and compiles nothing.
    warm = _run(cli, tmp_path / "nvme2", shared, report, command=server, NEFFSIM_VLLM_DEVICE=INSTANCE,
                VLLM_NEURON_DISABLE_WARMUP_COMPILE="1")
    assert (warm["prefetched"], warm["compile"]) == (4, 0), warm["stderr"]
    assert all(e.state is EntryState.SUCCESS for e in scan(LocalStore(tmp_path / "nvme2")).entries)


def test_bad_local_settings_are_refused(cli: Cli, tmp_path: Path) -> None:
    for args, words in ((["--local", str(tmp_path / "nvme")], "shared tier"),
                        (["--local", str(tmp_path / "s"), "--store", str(tmp_path / "s")], "shared tier"),
                        (["--local", str(tmp_path / "n"), "--store", str(tmp_path / "s"),
                          "--prefetch-max-bytes", "lots"], "lots")):
        proc = cli.run("run", "--instance", INSTANCE, *args, "--", *TRAIN)
        assert proc.returncode != 0 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_shared_tier_that_is_down_is_reported_and_the_job_runs(cli: Cli, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    proc = cli.run("run", "--instance", INSTANCE, "--local", str(tmp_path / "nvme"), "--store", "s3://no-bucket/x",
                   "--endpoint-url", "http://127.0.0.1:9", "--report", str(report), "--", *TRAIN,
                   TORCH_NEURONX_COMPILE_ONLY="", AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x",
                   AWS_DEFAULT_REGION="us-east-1")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(report.read_text())
    assert "cannot reach" in got["prefetch"]["error"] and got["compile"] == 3
    assert "the prefetch failed, the job ran without it" in proc.stderr
