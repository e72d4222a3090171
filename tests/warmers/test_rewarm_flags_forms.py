"""`neffcache rewarm` names its entries in the flags form of the namespace it writes into: decided
from that namespace's own entries (the libneuronxla release that wrote them), else the version
table, else `--flags-form`; the simulated runtime of that form then hits every graph. Real
subprocesses over the simulated toolchain (NEFFSIM_FLAGS_FORM picks the simulated release)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from neffcache.testing.hlo import make_hlo
from tests.runtime_caches import module_name
from tests.warmers.conftest import Cli, healthy, summary, warm_args

pytestmark = pytest.mark.slow

V13 = "2.13.72.0+7a3b8c9d"  # text form
V14 = "2.14.227.0+2d4f85be"  # SDK 2.19.0 wrote text, SDK 2.19.1 list, with this same compiler
V15 = "2.15.128.0+56dc5a86"  # list form
V16 = "2.16.372.0+0badc0de"  # target form
XLA_ARGS = ("--model", "llama-tiny", "--bucket", "128", "--graphs", "3")


def _hits(cli: Cli, store: Path, **env: str) -> dict[str, int]:
    """The simulated runtime on the three graphs: its summary, checked against its hit lines."""
    run = cli.workload(store, *XLA_ARGS, **env)
    assert run.returncode == 0, run.stderr
    counts = summary(run.stderr)
    assert run.stderr.count("Using a cached neff at") == counts["hits"]
    return counts


def _form(report: dict[str, Any], version: str) -> dict[str, Any]:
    (form,) = [f for f in report["flags_forms"] if f["namespace"] == f"trn2-lnc2/neuronxcc-{version}"]
    return form


@pytest.mark.parametrize("release", ["text", "list"])
def test_same_compiler_two_releases_each_store_gets_its_runtimes_names(cli: Cli, tmp_path: Path,
                                                                       release: str) -> None:
    """Two stores, compiler 2.14.227.0 in both: one's namespace already holds an entry a text-form
    runtime wrote, the other's one a list-form runtime wrote. A rewarm of three other graphs into
    each is then hit 3/3 by that store's runtime."""
    store = tmp_path / release
    cli.bump(V13)
    assert cli.json(*warm_args(store, buckets="128", graphs=3))["ok"]
    cli.bump(V14)
    other = cli.workload(store, "--model", "another-model", "--bucket", "128", "--graphs", "1",
                         NEFFSIM_FLAGS_FORM=release)
    assert summary(other.stderr)["compiled"] == 1, other.stderr

    report = cli.json("rewarm", "--from-compiler", V13, "--store", str(store), "-q")
    assert report["totals"]["compiled"] == 3 and report["ok"], report
    form = _form(report, V14)
    assert (form["form"], form["rule"], form["evidence"]["forms"]) == (release, "entries", {release: 1})

    new = [e for e in healthy(store).entries if e.namespace.compiler_version == V14]
    assert len(new) == 4  # the runtime's entry and the three rewarmed ones, none CORRUPT
    for entry in new:
        # The text form has no model.done: its NEFF commits the entry, for the runtime and for us.
        assert ("model.done" in entry.files) is (release == "list"), entry.files
        assert entry.marker_name == ("model.done" if release == "list" else "model.neff")
    counts = _hits(cli, store, NEFFSIM_FLAGS_FORM=release)
    assert (counts["graphs"], counts["hits"], counts["compiled"]) == (3, 3, 0)
    # upgrade-report looks for exactly what the rewarm wrote: the same decision.
    upgrade = cli.json("upgrade-report", "--from", V13, "--to", V14, "--store", str(store), "-q")
    assert (upgrade["graphs"], upgrade["ready"]) == (3, 3)
    assert [(f["form"], f["rule"]) for f in upgrade["flags_forms"]] == [(release, "entries")]


def test_an_empty_2_14_227_namespace_says_the_table_is_ambiguous(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    cli.bump(V13)
    assert cli.json(*warm_args(store, buckets="128", graphs=3))["ok"]
    cli.bump(V14)
    proc = cli.run("rewarm", "--from-compiler", V13, "--store", str(store), "-q")
    assert proc.returncode == 0, proc.stderr
    assert f"flags form of trn2-lnc2/neuronxcc-{V14}: list (decided by version table)" in proc.stdout
    assert "2.14.227.0 was shipped with both forms (text and list): warm one graph with the runtime first, " \
           "or pass --flags-form" in proc.stdout


def test_flags_form_overrides_and_why_miss_says_which_rule_decided(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    cli.bump(V15)
    assert cli.json(*warm_args(store, buckets="128", graphs=3))["ok"]
    cli.bump(V16)
    report = cli.json("rewarm", "--from-compiler", V15, "--store", str(store), "--flags-form", "list", "-q")
    assert report["totals"]["compiled"] == 3 and report["ok"], report
    form = _form(report, V16)
    assert (form["form"], form["rule"]) == ("list", "override")
    assert "forced by --flags-form (the namespace's version table said target)" in form["explanation"]
    # A release writing the list form under 2.16.372.0 finds them all.
    counts = _hits(cli, store, NEFFSIM_FLAGS_FORM="list")
    assert (counts["hits"], counts["compiled"]) == (3, 0)

    # The 2.16 runtime of the target form looks for its own names: why-miss compares its key
    # under the namespace's decided form (its entries: list), says so, and names the form change.
    missed = f"trn2-lnc2/neuronxcc-{V16}/{module_name(make_hlo('llama-tiny', 128, 0), '', V16, 'trn2')}"
    found = cli.json("why-miss", missed, "--store", str(store))
    (graph,) = found["graphs"]
    decision = graph["missed"]["flags_form_decision"]
    assert (decision["form"], decision["rule"], decision["evidence"]["forms"]) == ("list", "entries", {"list": 3})
    assert graph["missed"]["flags_form_rule"] == "entries"
    (rule,) = [d for d in graph["nearest"][0]["differences"] if d["field"] == "key_rule"]
    assert (rule["found"], rule["wanted"], rule["note"]) == (
        "list", "target", "job's: inferred from the key; entry's: its flags file")
    assert graph["cause"] == "flags-file form list → target (same flags, new suffix)"
    text = cli.run("why-miss", missed, "--store", str(store))
    assert text.returncode == 0, text.stderr
    assert f"keys compared under: trn2-lnc2/neuronxcc-{V16}: flags form list (entries)" in text.stdout

    # Forcing the target form now names what the target runtime looks for.
    again = cli.json("rewarm", "--from-compiler", V15, "--store", str(store), "--flags-form", "target", "-q")
    assert again["totals"]["compiled"] == 3 and _form(again, V16)["rule"] == "override"
    assert any("overrides the namespace's own entries" in note for note in again["notes"])
    counts = _hits(cli, store)
    assert (counts["hits"], counts["compiled"]) == (3, 0)
