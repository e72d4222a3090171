"""``prune --failed environment|compiler|expired``: the failure logs say which failed entries the
host failed and which the compiler rejected; the guard rails and the journal stay."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from neffcache.entry import EntryState
from neffcache.failures import FailureClass
from neffcache.prune import FailedSelect, PrunePolicy
from neffcache.prune.candidates import PruneCandidate
from neffcache.prune.rules import select_entries
from tests.simulation import Sim


def _prune(sim: Sim, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "neffcache.cli.main", "prune", *args], capture_output=True,
                          text=True, env=sim.env, check=False, timeout=60)


def _cache(sim: Sim) -> Path:
    """A cache the simulated runtime filled: g0 rejected by the compiler, g1 killed (the OOM
    killer's SIGKILL), g2 and g3 compiled."""
    cache = sim.root / "xla-cache"
    proc = sim.run_workload("--graphs", "4", "--bucket", "128", NEURON_COMPILE_CACHE_URL=str(cache),
                            NEFFSIM_FAIL_MATCH="g0$", NEFFSIM_KILL_MATCH="g1$")
    assert "failed=2" in proc.stderr, proc.stderr
    return cache


def _planned(sim: Sim, cache: Path, *args: str) -> dict[str, str]:
    proc = _prune(sim, "--store", str(cache), "--json", "--entries", *args)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)["plan"]
    return {item["path"]: item["detail"] for item in plan["items"]}


def test_failed_environment_removes_only_what_the_host_failed(sim: Sim) -> None:
    cache = _cache(sim)
    logs = sorted(cache.rglob("model.log"))
    killed = next(p.parent for p in logs if "exit status -9" in p.read_text())
    rejected = next(p.parent for p in logs if "NCC_ESIM001" in p.read_text())

    env_plan = _planned(sim, cache, "--failed", "environment")
    assert [Path(p).name for p in env_plan] == [killed.name]
    assert "environment failure" in next(iter(env_plan.values()))
    compiler_plan = _planned(sim, cache, "--failed", "compiler")
    assert [Path(p).name for p in compiler_plan] == [rejected.name]
    assert "signature" in next(iter(compiler_plan.values()))
    assert len(_planned(sim, cache, "--failed")) == 2  # a bare --failed is all of them

    done = _prune(sim, "--store", str(cache), "--failed", "environment", "--yes")
    assert done.returncode == 0, done.stderr
    assert not killed.exists() or not any(killed.iterdir())  # every file of it gone
    assert (rejected / "model.log").is_file()
    assert len(list(cache.rglob("model.done"))) == 2
    history = _prune(sim, "--store", str(cache), "--history", "--json")
    (action,) = json.loads(history.stdout)["actions"]
    assert [item["path"].rsplit("/", 1)[-1] for item in action["items"]] == [killed.name]


def test_failed_expired_needs_a_ttl_and_takes_only_old_failures(sim: Sim) -> None:
    cache = _cache(sim)
    refused = _prune(sim, "--store", str(cache), "--failed", "expired")
    assert refused.returncode == 2 and "--failed-ttl" in refused.stderr
    assert _planned(sim, cache, "--failed", "expired", "--failed-ttl", "1d") == {}
    old = next(cache.rglob("model.log"))
    then = time.time() - 3 * 86400
    os.utime(old, (then, then))
    for name in ("model.hlo_module.pb", "compile_flags.json"):
        os.utime(old.parent / name, (then, then))
    aged = _planned(sim, cache, "--failed", "expired", "--failed-ttl", "2d")
    assert [Path(p).name for p in aged] == [old.parent.name] and "past the failure TTL" in next(iter(aged.values()))
    env = {**sim.env, "NEFFCACHE_FAILED_TTL": "2d"}
    proc = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "prune", "--store", str(cache), "--json",
                           "--failed", "expired"], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0 and json.loads(proc.stdout)["plan"]["entries"] == 1


def _candidate(path: str, cls: FailureClass | None) -> PruneCandidate:
    return PruneCandidate("s", path, "neuronxcc", "2.27", "trn2", 2, EntryState.FAILED, 10, time.time(),
                     failure_class=cls)


def test_a_class_unknown_to_the_plan_is_kept_and_said() -> None:
    candidates = [_candidate("a", FailureClass.ENVIRONMENT), _candidate("b", FailureClass.COMPILER),
                  _candidate("c", None)]  # a plan from the index: no failure log was read
    chosen = select_entries(candidates, PrunePolicy(failed=True, failed_select=FailedSelect.ENVIRONMENT))
    assert [i.path for i in chosen.items] == ["a"]
    assert any("1 failed entries kept" in n for n in chosen.notes)
    every = select_entries(candidates, PrunePolicy(failed=True))
    assert [i.path for i in every.items] == ["a", "b", "c"]
