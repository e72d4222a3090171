"""`neffcache prefetch` (issue 36): a pod's NEFFs from the shared tier to node-local disk, verified.

Real processes throughout: `neffcache warm` fills a shared store, `neffcache prefetch` copies to
an empty local directory, and the simulated runtime, run with the exports prefetch printed,
compiles nothing. A tampered entry is reported and not copied; the rest are.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from neffcache.entry import EntryState
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from tests.warmers.conftest import INSTANCE, WORKLOAD, Cli, summary, warm_args
from tests.warmers.test_vllm_warm import SERVER, vllm_warm_args


def _prefetch(cli: Cli, store: Path, local: Path, *extra: str, rc: int = 0, **env: str) -> dict[str, Any]:
    return cli.json("prefetch", "--instance", INSTANCE, "--store", str(store), "--to", str(local), *extra, rc=rc,
                    **env)


def _job(cli: Cli, env: dict[str, str], *args: str, backend: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WORKLOAD, "--backend", backend, "--model", "llama-tiny", *args],
                          env=cli.environ(**env), capture_output=True, text=True, timeout=120, check=False)


def test_a_job_run_against_the_prefetched_local_tier_compiles_nothing(cli: Cli, tmp_path: Path) -> None:
    shared, local = tmp_path / "shared", tmp_path / "nvme"
    for backend in ("xla", "native"):
        cli.json(*warm_args(shared, backend=backend))
    first = _prefetch(cli, shared, local)
    assert first["ok"] and first["copied"] == 8 and first["present"] == 0 and first["bytes"] > 0
    assert first["unsigned"] == 8  # no key is trusted here: copied, and said so
    report = scan(LocalStore(local), read_manifests=True)
    assert len(report.entries) == 8 and all(e.state is EntryState.SUCCESS for e in report.entries)
    before = len(cli.sim.compiles())
    for backend in ("xla", "native"):
        job = _job(cli, first["env"], "--bucket", "128,256", "--graphs", "2", backend=backend)
        assert job.returncode == 0, job.stderr
        assert (summary(job.stderr)["hits"], summary(job.stderr)["compiled"]) == (4, 0), job.stderr
    assert len(cli.sim.compiles()) == before
    again = _prefetch(cli, shared, local)  # a rerun: incremental and idempotent
    assert (again["copied"], again["present"]) == (0, 8)


def test_a_tampered_entry_is_reported_and_the_rest_copied(cli: Cli, tmp_path: Path) -> None:
    shared, local = tmp_path / "shared", tmp_path / "nvme"
    cli.json(*warm_args(shared))
    entries = scan(LocalStore(shared)).entries
    neff = shared / entries[0].path / "model.neff"
    neff.write_bytes(b"EVIL" + neff.read_bytes()[4:])  # same size: only the digest can tell
    got = _prefetch(cli, shared, local, rc=1)
    assert got["copied"] == len(entries) - 1 and [f["path"] for f in got["failed"]] == [entries[0].path]
    assert "sha256" in got["failed"][0]["detail"]
    assert not (local / entries[0].path).exists()
    best = _prefetch(cli, shared, local, "--best-effort")
    assert best["copied"] == 0 and best["present"] == len(entries) - 1 and len(best["failed"]) == 1


def test_budget_order_and_report_narrowing(cli: Cli, tmp_path: Path) -> None:
    shared, local = tmp_path / "shared", tmp_path / "nvme"
    cli.json(*warm_args(shared, buckets="128,256,512"))
    entries = scan(LocalStore(shared)).entries
    size = max(e.size for e in entries)
    tight = _prefetch(cli, shared, local, "--max-bytes", str(size * 2 + size // 2))
    assert tight["copied"] == 2 and tight["over_budget"] == len(entries) - 2
    report = tmp_path / "plan.json"
    report.write_text(json.dumps({"graphs": [{"path": entries[-1].path}, {"path": "../escape"}]}))
    narrowed = _prefetch(cli, shared, tmp_path / "other", "--from-report", str(report))
    assert narrowed["copied_paths"] == [entries[-1].path]
    late = _prefetch(cli, shared, tmp_path / "third", "--deadline", "0s")
    assert late["copied"] == 0 and late["after_deadline"] == len(entries)


def test_a_vllm_server_prefetched_to_its_local_tier_starts_warm(cli: Cli, tmp_path: Path) -> None:
    """The shared tier's flat <hash>/ entries land in VLLM_CACHE_ROOT's neuron/compile_cache/ form:
    a server that must not compile (VLLM_NEURON_DISABLE_WARMUP_COMPILE=1) starts without reading
    the shared tier at all (its variable removed)."""
    shared, local = tmp_path / "shared", tmp_path / "nvme"
    cli.json(*vllm_warm_args(shared, buckets="128"))
    got = _prefetch(cli, shared, local, "--layout", "vllm")
    assert got["copied"] == 2
    env = {k: v for k, v in got["env"].items() if k != "NEURON_LIBTORCH_REMOTE_CACHE"}
    assert env["VLLM_CACHE_ROOT"].startswith(str(local))
    assert len(list(Path(env["VLLM_CACHE_ROOT"], "neuron", "compile_cache").iterdir())) == 2
    served = subprocess.run([*SERVER, "--model", "llama-tiny", "--bucket", "128", "--graphs", "2",
                             "--exit-when-ready"],
                            env=cli.environ(**env, VLLM_NEURON_DISABLE_WARMUP_COMPILE="1",
                                            NEFFSIM_VLLM_DEVICE=INSTANCE),
                            capture_output=True, text=True, timeout=120, check=False)
    assert served.returncode == 0, served.stderr


def test_env_file_and_bad_input(cli: Cli, tmp_path: Path) -> None:
    shared, local = tmp_path / "shared", tmp_path / "nvme"
    cli.json(*warm_args(shared, buckets="128", graphs=1))
    env_file = tmp_path / "pod.env"
    got = _prefetch(cli, shared, local, "--env-file", str(env_file))
    text = env_file.read_text()
    assert f"export NEURON_COMPILE_CACHE_URL={got['env']['NEURON_COMPILE_CACHE_URL']}" in text
    for bad in (["--max-bytes", "lots"], ["--deadline", "soon"], ["--from-report", str(env_file)]):
        proc = cli.run("prefetch", "--instance", INSTANCE, "--store", str(shared), "--to", str(local), *bad)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
