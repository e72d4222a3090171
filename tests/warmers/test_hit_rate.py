"""The hit rate is the jobs': a warm-up's compiles are work ahead of demand, not misses.

The issue's own case, end to end through real processes: warm 3 graphs, then a job hits 3/3;
`neffcache stats --json` says hit_rate 1.0 and shows the warm-up's 3 compiles apart. TorchNeuron
(native) counts its compiles from the cache's growth and reports disk hits without a path: the
same answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.warmers.conftest import INSTANCE, WORKLOAD, Cli, Index, warm_args


@pytest.mark.parametrize("backend", ["xla", "native"])
def test_after_a_warm_up_a_job_that_hits_three_of_three_has_hit_rate_one(cli: Cli, tmp_path: Path, index: Index,
                                                                         backend: str) -> None:
    store = tmp_path / "cache"
    warm = cli.run(*warm_args(store, buckets="128", graphs=3, backend=backend))
    assert warm.returncode == 0, warm.stderr
    job = cli.run("run", "--instance", INSTANCE, "--store", str(store), "--", *WORKLOAD, "--model", "llama-tiny",
                  "--bucket", "128", "--graphs", "3", "--steps", "1", "--backend", backend,
                  TORCH_NEURONX_COMPILE_ONLY="")
    assert job.returncode == 0 and "3 hits, 0 misses, 0 compiles" in job.stderr, job.stderr

    proc = cli.run("stats", "--window", "1h", "--json", "--token", index.tokens.read)
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    assert stats["hit_rate"] == 1.0
    assert (stats["totals"]["hits"], stats["totals"]["misses"], stats["totals"]["compiles"]) == (3, 0, 0)
    assert stats["warm_ups"]["compiles"] == 3 == stats["by_source"]["warm"]["compiles"]
    assert stats["top_misses"] == []  # the warm-up's own graphs are not "missing"

    text = cli.run("stats", "--window", "1h", "--token", index.tokens.read).stdout
    assert "hit rate        100.0%  (3 hits, 0 misses: job traffic)" in text
    assert "warm-ups        3 graphs compiled ahead of demand" in text
