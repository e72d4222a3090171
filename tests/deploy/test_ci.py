"""deploy/ci: every `neffcache ...` line the GitHub Actions and GitLab CI recipes run is a real
command with real flags (for every shard of the matrix), the shards cover 0..N-1 exactly, and
the recipes do what the guide says: warm on image/model changes, rewarm + prune on a bump."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from neffcache.toolchain import validate_version
from tests.deploy.commands import Invocation, expand, neffcache_argvs, parse_invocation
from tests.deploy.files import CI
from tests.deploy.settings import read_by_code

GITHUB: dict[str, Any] = yaml.safe_load((CI / "github-actions.yml").read_text())
GITLAB: dict[str, Any] = yaml.safe_load((CI / "gitlab-ci.yml").read_text())
PIN = dict(line.split("=", 1) for line in (CI / "neuron-sdk.env").read_text().splitlines()
           if line.strip() and not line.startswith("#"))
PREVIOUS = "2.21.33363.0+82129205"
# What the CI systems (or earlier jobs) provide at run time.
RUNTIME = {
    "GITHUB_SHA": "0123456789abcdef", "GITHUB_OUTPUT": "/tmp/out", "CI_COMMIT_SHA": "0123456789abcdef",
    "needs.image.outputs.previous": PREVIOUS, "needs.image.outputs.warmer": "registry/warmer:sha",
    "secrets.NEFFCACHE_WRITER_TOKEN": "nfc_token", "PREVIOUS_COMPILER": PREVIOUS, "COMPILER_BUMPED": "true",
    "NEFFCACHE_WRITER_TOKEN": "nfc_token", **PIN,
}


def _env_values(env: dict[str, Any] | None, scope: dict[str, str]) -> dict[str, str]:
    return {k: expand(str(v), scope) for k, v in (env or {}).items()}


def github_runs() -> Iterator[tuple[str, dict[str, str], str, int]]:
    """(job, values, script, shard count) for every run step and matrix combination."""
    for job_name, job in GITHUB["jobs"].items():
        matrix = job.get("strategy", {}).get("matrix", {})
        keys = list(matrix)
        combos = list(itertools.product(*(matrix[k] for k in keys))) or [()]
        for combo in combos:
            values = {**RUNTIME, **{f"matrix.{k}": str(v) for k, v in zip(keys, combo, strict=True)}}
            values.update(_env_values(GITHUB.get("env"), values))
            values.update({f"env.{k}": v for k, v in _env_values(GITHUB.get("env"), values).items()})
            values.update(_env_values(job.get("env"), values))
            for step in job["steps"]:
                if "run" in step:
                    step_values = {**values, **_env_values(step.get("env"), values)}
                    yield job_name, step_values, step["run"], len(matrix.get("shard", [1]))


def _gitlab_job(name: str) -> dict[str, Any]:
    job = GITLAB[name]
    merged: dict[str, Any] = {}
    parents = job.get("extends", [])
    for parent in [parents] if isinstance(parents, str) else parents:
        merged.update({k: v for k, v in _gitlab_job(parent).items() if k != "variables"})
        merged.setdefault("variables", {}).update(_gitlab_job(parent).get("variables", {}))
    merged.update({k: v for k, v in job.items() if k not in ("extends", "variables")})
    merged.setdefault("variables", {}).update(job.get("variables", {}))
    return merged


def gitlab_runs() -> Iterator[tuple[str, dict[str, str], str, int]]:
    for name, raw in GITLAB.items():
        if name.startswith(".") or not isinstance(raw, dict) or "script" not in raw:
            continue
        job = _gitlab_job(name)
        count = int(job.get("parallel", 1))
        for index in range(1, count + 1):
            values = {**RUNTIME, "CI_NODE_INDEX": str(index), "CI_NODE_TOTAL": str(count)}
            values.update(_env_values(GITLAB.get("variables"), values))
            values.update(_env_values(job.get("variables"), values))
            yield name, values, "\n".join(job["script"]), count


RUNS = [("github", *r) for r in github_runs()] + [("gitlab", *r) for r in gitlab_runs()]


def invocations(ci: str) -> dict[str, list[tuple[Invocation, int]]]:
    out: dict[str, list[tuple[Invocation, int]]] = {}
    for where, job, values, script, count in RUNS:
        if where == ci:
            for argv in neffcache_argvs(script, values):
                out.setdefault(job, []).append((parse_invocation(argv), count))
    return out


@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_every_neffcache_line_is_a_real_command(ci: str) -> None:
    found = invocations(ci)
    commands = {inv.name for runs in found.values() for inv, _ in runs}
    assert {"warm", "rewarm", "prune"} <= commands, commands


@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_shards_cover_every_part_exactly_once(ci: str) -> None:
    for job, runs in invocations(ci).items():
        sharded = [(inv.params["shard"], count) for inv, count in runs if inv.params.get("shard")]
        if not sharded:
            continue
        count = sharded[0][1]
        assert count > 1, job
        assert sorted(s for s, _ in sharded) == sorted(f"{i}/{count}" for i in range(count)), job


@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_warm_targets_trn2_and_publishes_to_s3(ci: str) -> None:
    found = invocations(ci)
    warms = [inv for inv, _ in found["warm"]]
    assert all(inv.params["instance"] == "trn2.48xlarge" for inv in warms)
    assert all(any(s.startswith("s3://") for s in inv.params["stores"]) for inv in warms)
    rewarms = [inv for inv, _ in found["rewarm"]]
    assert all(validate_version(inv.params["from_version"]) for inv in rewarms)
    prunes = [inv for inv, _ in found["prune"]]
    # The plan is printed by a run without --yes before the run that executes it.
    assert [inv.params["yes"] for inv in prunes] == [False, True]
    assert prunes[0].argv == prunes[1].argv[:-1]


def test_pinned_compiler_version_is_valid() -> None:
    assert validate_version(PIN["NEURONX_CC_VERSION"])
    assert PIN["NEURON_IMAGE"].startswith("public.ecr.aws/neuron/")


def test_github_triggers_and_ordering() -> None:
    on = GITHUB.get("on") or GITHUB[True]  # YAML 1.1 reads a bare `on` as true
    paths = on["push"]["paths"]
    assert "neuron-sdk.env" in paths and "Dockerfile" in paths
    jobs = GITHUB["jobs"]
    assert "bumped" in jobs["rewarm"]["if"] and "bumped" in jobs["prune"]["if"]
    assert "rewarm" in jobs["warm"]["needs"] and "warm" in jobs["prune"]["needs"]


def test_gitlab_rules_and_ordering() -> None:
    assert GITLAB["stages"].index("rewarm") < GITLAB["stages"].index("warm") < GITLAB["stages"].index("prune")
    bump = GITLAB[".compiler-bump"]["rules"][0]["changes"]
    change = GITLAB[".image-or-model-change"]["rules"][0]["changes"]
    assert bump == ["neuron-sdk.env"] and "neuron-sdk.env" in change and "Dockerfile" in change
    assert _gitlab_job("rewarm")["rules"] == GITLAB[".compiler-bump"]["rules"]
    assert _gitlab_job("prune")["rules"] == GITLAB[".compiler-bump"]["rules"]


def test_neffcache_variables_the_recipes_set_are_read_by_the_code() -> None:
    names = set(GITHUB.get("env", {})) | set(GITLAB.get("variables", {}))
    for job in GITHUB["jobs"].values():
        names |= set(job.get("env", {}))
    for job in GITLAB.values():
        if isinstance(job, dict):
            names |= set(job.get("variables", {}))
    for name in names:
        if name.startswith(("NEFFCACHE_", "AWS_")) and name != "NEFFCACHE_VERSION":
            assert read_by_code(name), name
