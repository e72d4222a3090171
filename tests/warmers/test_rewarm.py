"""`neffcache rewarm` after a simulated compiler bump: the new runtime then hits everything."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest

from tests.warmers.conftest import V1, V2, Cli, Index, healthy, summary, warm_args

pytestmark = pytest.mark.slow

WORKLOAD_ARGS = ("--model", "llama-tiny", "--bucket", "128,256", "--graphs", "2")


def _warm_both_layouts(cli: Cli, store: Path, *stores: str) -> None:
    for backend in ("xla", "native"):
        extra = [a for s in stores for a in ("--store", s)]
        assert cli.json(*warm_args(store, *extra, "--tag", "model=llama-tiny", backend=backend))["ok"]


def test_rewarm_lands_where_the_new_runtime_looks(cli: Cli, tmp_path: Path, index: Index) -> None:
    store = tmp_path / "store"
    _warm_both_layouts(cli, store)
    cli.bump(V2)
    report = cli.json("rewarm", "--from-compiler", V1, "--store", str(store), "--parallel", "2", "-q")
    assert report["totals"]["compiled"] == 8 and report["ok"]
    assert sorted(report["namespaces"]) == [f"trn2-lnc2/neuronxcc-{V2}", f"trn2-lnc2/torchneuron-{V2}"]
    assert [r["version"] for r in cli.sim.compiles()].count(V2) == 8

    entries = healthy(store).entries
    old = {e.key for e in entries if e.layout == "neuronxcc" and e.namespace.compiler_version == V1}
    new = {e.key for e in entries if e.layout == "neuronxcc" and e.namespace.compiler_version == V2}
    assert old == new  # MODULE_<same>+<same>
    for e in entries:
        if e.namespace.compiler_version == V2:
            assert e.manifest and e.manifest.toolchain and e.manifest.toolchain.compiler_version == V2
            assert e.manifest.tags["model"] == "llama-tiny"  # carried over from the old entry

    counts = summary(cli.workload(store, *WORKLOAD_ARGS, backend="xla").stderr)
    assert (counts["hits"], counts["compiled"]) == (4, 0)
    # TorchNeuron's native runtime names NEFFs by its own key, which neffcache cannot compute:
    # rewarmed torchneuron entries (neffcache's key) are not what it looks for (see rewarm --help).
    counts = summary(cli.workload(store, *WORKLOAD_ARGS, backend="native").stderr)
    assert (counts["hits"], counts["compiled"]) == (0, 4)
    assert [r["version"] for r in cli.sim.compiles()].count(V2) == 12
    by_source = index.stats()["by_source"]
    assert (by_source["warm"]["compiles"], by_source["rewarm"]["compiles"], by_source["job"]["compiles"]) == (8, 8, 0)

    again = cli.json("rewarm", "--from-compiler", V1, "--store", str(store), "-q")
    assert (again["totals"]["hits"], again["totals"]["compiled"]) == (8, 0)


@pytest.mark.s3
def test_a_graph_the_rewarm_fails_is_registered_failed(cli: Cli, tmp_path: Path, index: Index) -> None:
    """The index's health counts what a rewarm failed: the dashboard never says every entry is
    healthy beside a FAILED one."""
    store = tmp_path / "store"
    assert cli.json(*warm_args(store, backend="xla"))["ok"]
    cli.bump(V2)
    report = cli.json("rewarm", "--from-compiler", V1, "--store", str(store), "-q", rc=1, NEFFSIM_FAIL_MATCH="b256/g1$")
    assert report["totals"]["failed"] == 1
    (failed,) = [e for e in healthy(store).entries if e.state.value == "FAILED"]
    assert failed.namespace.compiler_version == V2
    listed = {e["path"]: e["state"] for e in index.entries()}
    assert listed[failed.path] == "FAILED"
    stats = index.stats()
    assert stats["entries_by_state"]["FAILED"] == 1
    assert [p["path"] for p in stats["problem_entries"]] == [failed.path]


def test_sharded_rewarm_on_two_hosts_through_s3(cli: Cli, tmp_path: Path, s3: str) -> None:
    _warm_both_layouts(cli, tmp_path / "warm-host", s3)
    cli.bump(V2)
    procs = [cli.popen("rewarm", "--from-compiler", V1, "--store", str(tmp_path / f"host-{i}"), "--store", s3,
                       "--shard", f"{i}/2", "--json", "-q") for i in range(2)]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    assert sum(r["totals"]["compiled"] for r in reports) == 8
    assert all(r["totals"]["compiled"] < 8 for r in reports)  # the work was split
    v2 = [r for r in cli.sim.compiles() if r["version"] == V2]
    # The two layouts hold the same four graphs: each HLO compiled once per layout, never more.
    assert sorted(Counter(r["hlo_sha256"] for r in v2).values()) == [2, 2, 2, 2]
    remote = healthy(s3, endpoint_url=cli.env["AWS_ENDPOINT_URL_S3"]).entries
    assert sum(1 for e in remote if e.namespace.compiler_version == V2) == 8

    # A third host pulls the new namespace and its runtime only hits.
    fresh = tmp_path / "fresh"
    assert cli.json(*warm_args(fresh, "--store", s3))["totals"]["hits"] == 4
    assert summary(cli.workload(fresh, *WORKLOAD_ARGS).stderr)["compiled"] == 0


def test_rewarm_refuses_the_installed_version(cli: Cli, tmp_path: Path) -> None:
    proc = cli.run("rewarm", "--from-compiler", V1, "--store", str(tmp_path / "store"))
    assert proc.returncode == 2 and "already" in proc.stderr


# -- neuronxcc across the flags-file forms, and beside a live runtime ------------------------------
V20 = "2.15.128.0+56dc5a86"  # list form: compile_flags.json = json.dumps(user flags)
V21 = "2.16.372.0+0badc0de"  # target form: compile_flags.json = json.dumps(["--target=<t>", *user flags])
FLAGS = "--model-type=transformer -O1"
XLA_ARGS = ("--model", "llama-tiny", "--bucket", "128", "--graphs", "3")


def test_rewarm_across_the_target_form_lands_where_the_new_runtime_looks(cli: Cli, tmp_path: Path) -> None:
    """2.15 -> 2.16: the target joined the flags file at 2.16.345.0 (an earlier table put it at
    2.21, and the 2.16 runtime then hit 0 of 3 rewarmed graphs)."""
    store = tmp_path / "store"
    cli.bump(V20)
    assert cli.json(*warm_args(store, buckets="128", graphs=3), NEURON_CC_FLAGS=FLAGS)["ok"]
    old = {e.key: e for e in healthy(store).entries if e.namespace.compiler_version == V20}
    assert len(old) == 3
    cli.bump(V21)
    report = cli.json("rewarm", "--from-compiler", V20, "--store", str(store), "-q")
    assert report["totals"]["compiled"] == 3 and report["ok"], report
    # The new namespace is empty: the version table decided, and the report says so.
    (form,) = [f for f in report["flags_forms"] if f["namespace"] == f"trn2-lnc2/neuronxcc-{V21}"]
    assert (form["form"], form["rule"], form["evidence"]["entries_read"]) == ("target", "version table", 0)

    new = {e.key: e for e in healthy(store).entries if e.namespace.compiler_version == V21}
    assert {k.split("+")[0] for k in new} == {k.split("+")[0] for k in old}  # same graph hashes
    assert not set(new) & set(old)  # the suffix changed with the flags file's form
    for entry in new.values():
        flags_file = store / entry.path / "compile_flags.json"
        assert json.loads(flags_file.read_text()) == ["--target=trn2", *FLAGS.split()]
        assert entry.key.endswith("+" + hashlib.md5(flags_file.read_bytes()).hexdigest()[:8])

    # The 2.16 runtime finds every one of them: before, it found 0 of 3 and compiled them all.
    run = cli.workload(store, *XLA_ARGS, NEURON_CC_FLAGS=FLAGS)
    counts = summary(run.stderr)
    assert (counts["graphs"], counts["hits"], counts["compiled"]) == (3, 3, 0)
    assert run.stderr.count("Using a cached neff at") == 3


def test_rewarm_reports_and_skips_an_entry_whose_flags_file_does_not_match(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    # Written by the runtime itself (no manifest: nothing but the MODULE name vouches for the flags).
    assert summary(cli.workload(store, *XLA_ARGS).stderr)["compiled"] == 3
    edited, missing, _ = sorted((e for e in healthy(store).entries if e.layout == "neuronxcc"), key=lambda e: e.path)
    (store / edited.path / "compile_flags.json").write_text(json.dumps(["--target=trn2", "-O3"]))
    (store / missing.path / "compile_flags.json").unlink()
    cli.bump(V2)
    report = cli.json("rewarm", "--from-compiler", V1, "--store", str(store), "-q", rc=1)
    assert report["totals"]["compiled"] == 1 and report["totals"]["failed"] == 2
    failures = {f["what"]: f for g in report["groups"] for f in g["failures"]}
    assert failures[edited.path]["kind"] == "flags"
    assert "does not match the MODULE name" in failures[edited.path]["reason"]
    assert "no flags file" in failures[missing.path]["reason"]
    compiled = [r for r in cli.sim.compiles() if r["version"] == V2]
    assert len(compiled) == 1  # neither bad entry reached the compiler


def test_a_runtime_and_a_rewarm_on_one_root_compile_each_graph_once(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert cli.json(*warm_args(store, buckets="128", graphs=4))["ok"]
    cli.bump(V2)
    slow = {"NEFFSIM_COMPILE_SECONDS": "0.6", "NEFFSIM_LOCK_LOG_SECONDS": "0.2"}
    rewarm = cli.popen("rewarm", "--from-compiler", V1, "--store", str(store), "--layout", "neuronxcc",
                       "--json", "-q", **slow)
    runtime = cli.workload(store, "--model", "llama-tiny", "--bucket", "128", "--graphs", "4", **slow)
    out, err = rewarm.communicate(timeout=120)
    assert rewarm.returncode == 0, err
    assert runtime.returncode == 0, runtime.stderr
    v2 = [r for r in cli.sim.compiles() if r["version"] == V2]
    assert sorted(Counter(str(r["graph"]) for r in v2).values()) == [1, 1, 1, 1], v2  # each graph once
    report = json.loads(out)
    counts = summary(runtime.stderr)
    assert report["totals"]["compiled"] + counts["compiled"] == 4
    assert counts["hits"] + counts["compiled"] == 4
    assert not list(store.rglob("*.lock"))
    healthy(store)
