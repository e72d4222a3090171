"""`neffcache upgrade-report` after a shadow `rewarm` with the simulated toolchain: the slower
graph and the new failure it lists, readiness weighed by the index's hits (checked against a
hand computation), the gate, and the gate passing once the failure is fixed and rewarmed."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from neffcache.entry import Entry
from neffcache.index import IndexClient, entry_record
from neffcache.layouts import get_layout
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import publish
from neffcache.scan.report import load_entry, scan
from neffcache.stores import open_store
from neffcache.testing.hlo import make_hlo
from neffcache.toolchain import Toolchain
from tests.runtime_caches import flags_file, module_name
from tests.warmers.conftest import V1, V2, Cli, Index, healthy, warm_args

pytestmark = pytest.mark.slow

FLAGS = "--model-type=transformer"
TC1 = Toolchain(V1, "trn2", 2)
LABEL1, LABEL2 = f"trn2-lnc2/neuronxcc-{V1}", f"trn2-lnc2/neuronxcc-{V2}"
# graph -> (index in bucket 128, compile seconds V1 recorded, V1 NEFF bytes, hits in the window).
# The simulated compiler writes NEFFs of 10x the HLO (200 kB here) and, for "slow", whose HLO
# header says 1.5 s, takes 1.5 s; the others compile in a process start (well under 20 s).
GRAPHS = {"hot": (0, 20.0, 1_000_000, 5), "grown": (1, 20.0, 50_000, 3), "slow": (2, 0.3, 1_000_000, 1),
          "fails": (3, 20.0, 1_000_000, 2)}
FAILS_UNDER_V2 = {"NEFFSIM_FAIL_MATCH": "llama-tiny/b128/g3$", "NEFFSIM_COMPILE_SECONDS": "0"}


def _publish_v1(store_root: Path, index: Index) -> dict[str, str]:
    """The old compiler's graphs as a warm-up published them (its manifests' compile times), each
    registered in the index and hit by jobs (plus one hit before the window)."""
    store = open_store(str(store_root))
    layout = get_layout("neuronxcc")
    ns = layout.namespace_for(TC1)
    client = IndexClient(index.url, index.tokens.write, spool_dir=store_root.parent / "spool")
    now, paths, records = time.time(), {}, []
    for name, (i, seconds, neff_bytes, hits) in GRAPHS.items():
        hlo = make_hlo("llama-tiny", 128, i, compile_seconds=1.5 if name == "slow" else None)
        key = module_name(hlo, FLAGS, V1, "trn2")
        flags_name, flags_bytes = flags_file(FLAGS, V1, "trn2")
        names = layout.names(ns, key)
        assert names.hlo and names.neff
        files: dict[str, Any] = {names.hlo: hlo, flags_name: flags_bytes, names.neff: b"N" * neff_bytes,
                                 names.marker: b""}
        manifest = build_manifest(layout.name, key, files, toolchain=TC1, flags=[FLAGS], compile_seconds=seconds,
                                  tags={"model": "llama-tiny"})
        publish(store, ns, key, files, manifest)
        entry = load_entry(store, f"{ns.path}/{key}")
        assert isinstance(entry, Entry)
        paths[name] = entry.path
        records.append(entry_record(entry, store.url))
        for n in range(hits):
            client.record("hit", path=entry.path, namespace=ns.path, toolchain=TC1, ts=now - 86400 - n)
    client.register_entries(records)
    client.record("hit", path=paths["grown"], namespace=ns.path, toolchain=TC1, ts=now - 40 * 86400)
    client.close()
    assert client.counts().lost == 0 and not client.counts().waiting
    return paths


def _report(cli: Cli, store: Path, *extra: str, rc: int = 0) -> dict[str, Any]:
    return cli.json("upgrade-report", "--from", V1, "--to", V2, "--store", str(store), "--window", "30d", "-q",
                    *extra, rc=rc)


def _paths(rows: list[dict[str, Any]]) -> list[str]:
    return [row["path"] for row in rows]


def _server_readiness(index: Index) -> float:
    with index.server.client(index.tokens.read) as client:
        reply = client.get("/v1/upgrades/readiness", params={"from_toolchain": LABEL1, "to_toolchain": LABEL2})
    (pair,) = reply.json()["pairs"]
    value: float = pair["readiness"]
    return value


def test_report_lists_the_slower_graph_and_the_new_failure_and_gates(cli: Cli, tmp_path: Path,
                                                                     index: Index) -> None:
    store = tmp_path / "store"
    paths = _publish_v1(store, index)
    cli.bump(V2)
    shadow = cli.json("rewarm", "--from-compiler", V1, "--store", str(store), "-q", rc=1, **FAILS_UNDER_V2)
    assert (shadow["totals"]["compiled"], shadow["totals"]["failed"]) == (3, 1)

    report = _report(cli, store, "--gate", "0.95", rc=14)
    # weight = hits in the window + 0.1; "grown"'s hit 40 days ago is outside the window.
    weights = {"hot": 5.1, "grown": 3.1, "slow": 1.1, "fails": 2.1}
    expected = (weights["hot"] + weights["grown"] + weights["slow"]) / sum(weights.values())
    assert report["readiness"] == pytest.approx(expected) == pytest.approx(9.3 / 11.4)
    assert (report["graphs"], report["ready"], report["weights"]["by"]) == (4, 3, "hits")
    assert _paths(report["missing"]) == [paths["fails"]]
    regressions = report["regressions"]
    assert _paths(regressions["slower"]) == [paths["slow"]]
    assert regressions["slower"][0]["compile_ratio"] > 1.5
    assert _paths(regressions["bigger"]) == [paths["grown"]]  # 50 kB -> 200 kB
    (failed,) = regressions["new_failures"]
    assert failed["path"] == paths["fails"] and failed["hits"] == 2
    # The key `neffcache failures` groups by (and `failures bundle` takes), then the error as written.
    assert re.match(r"^[0-9a-f]{16}: ERROR:neuronxcc: \[NCC_ESIM001\] Simulated compiler error in graph "
                    r"llama-tiny/b128/g3 ", failed["new"]["failure"]), failed["new"]["failure"]
    assert failed["new_path"] == f"{LABEL2}/{paths['fails'].rsplit('/', 1)[1]}"  # same era: same MODULE name

    successors = {e.path: e for e in scan(open_store(str(store)), prefix=LABEL2, read_manifests=True).entries}
    spent = sum(e.manifest.compile_seconds or 0 for e in successors.values() if e.manifest)
    totals = report["totals"]
    assert totals["rewarm_compile_hours"] == pytest.approx(spent / 3600)
    assert (totals["first_day_graphs"], totals["first_day_compile_hours"]) == (1, pytest.approx(20.0 / 3600))
    assert report["gate"]["passed"] is False and len(report["gate"]["reasons"]) == 2
    assert _server_readiness(index) == pytest.approx(expected)  # the dashboard's number is the same

    text = cli.run("upgrade-report", "--from", V1, "--to", V2, "--store", str(store), "--gate", "0.95", "-q")
    assert text.returncode == 14
    assert "readiness    81.6%" in text.stdout and "NOT READY" in text.stdout and paths["slow"] in text.stdout

    # The failure fixed (here: the compiler stops failing), rewarmed again: the gate passes.
    fixed = cli.json("rewarm", "--from-compiler", V1, "--store", str(store), "--retry-failed", "-q",
                     NEFFSIM_COMPILE_SECONDS="0")
    assert fixed["totals"]["compiled"] == 1
    after = _report(cli, store, "--gate", "0.95")
    assert (after["readiness"], after["missing"], after["regressions"]["new_failures"]) == (1.0, [], [])
    assert after["gate"] == {"fraction": 0.95, "passed": True, "reasons": []}
    assert _paths(after["regressions"]["slower"]) == [paths["slow"]]  # slower is reported, never gated
    assert _server_readiness(index) == pytest.approx(1.0)


def test_without_an_index_every_graph_weighs_the_same(cli: Cli, tmp_path: Path, index: Index) -> None:
    store = tmp_path / "store"
    paths = _publish_v1(store, index)
    cli.bump(V2)
    cli.json("rewarm", "--from-compiler", V1, "--store", str(store), "-q", rc=1, **FAILS_UNDER_V2)
    del cli.env["NEFFCACHE_INDEX_URL"]
    report = _report(cli, store)
    assert report["readiness"] == pytest.approx(3 / 4) and report["weights"]["by"] == "none"
    assert report["gate"] == {"fraction": None, "passed": None, "reasons": []}  # no gate: exit 0
    assert report["totals"]["first_day_graphs"] == 1 and _paths(report["missing"]) == [paths["fails"]]
    assert any("no index" in note for note in report["notes"])


def test_successors_across_the_2_16_345_flags_change_and_in_layout_b(cli: Cli, tmp_path: Path, index: Index) -> None:
    v20, v21 = "2.15.128.0+56dc5a86", "2.16.372.0+0badc0de"  # list form, then target form
    store = tmp_path / "store"
    cli.bump(v20)
    for backend in ("xla", "native"):
        assert cli.json(*warm_args(store, backend=backend), NEURON_CC_FLAGS="-O1")["ok"]
    cli.bump(v21)
    assert cli.json("rewarm", "--from-compiler", v20, "--store", str(store), "-q")["totals"]["compiled"] == 8
    old = {e.key for e in healthy(store).entries if e.namespace.compiler_version == v20}
    new = {e.key for e in healthy(store).entries if e.namespace.compiler_version == v21}
    assert not old & new  # layout A's suffix and layout B's key both changed

    report = cli.json("upgrade-report", "--from", v20, "--to", v21, "--store", str(store), "-q")
    assert (report["graphs"], report["ready"], report["readiness"]) == (8, 8, 1.0)
    # The same decision as the rewarm's: the new namespace's own (rewarmed) entries, target form.
    (form,) = report["flags_forms"]
    assert (form["namespace"], form["form"], form["rule"]) == (f"trn2-lnc2/neuronxcc-{v21}", "target", "entries")
    assert {row["new"]["path"] for row in report["by_graph"]} == {
        e.path for e in healthy(store).entries if e.namespace.compiler_version == v21}
    with httpx.Client(base_url=index.url, headers={"Authorization": f"Bearer {index.tokens.read}"}) as client:
        (pair,) = client.get("/v1/upgrades/readiness").json()["pairs"]
    # The index pairs them by the tag rewarm wrote: it cannot compute the new names itself.
    assert (pair["from_toolchain"], pair["to_toolchain"]) == tuple(f"trn2-lnc2/neuronxcc-{v}" for v in (v20, v21))
    assert (pair["graphs"], pair["ready_graphs"]) == (8, 8)


def test_bad_input_is_one_line_and_changes_nothing(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    for args, words in ((["--from", V1, "--to", V1], "both"),
                        (["--from", V1, "--to", V2], "the stores hold no compiler's entries"),
                        (["--from", V1, "--to", V2, "--window", "soon"], "duration"),
                        (["--from", V1, "--to", V2, "--gate", "1.5"], "1.5")):
        proc = cli.run("upgrade-report", *args, "--store", str(store))
        assert proc.returncode == 2, proc.stderr
        assert words in proc.stderr and "Traceback" not in proc.stderr
    assert list(store.iterdir()) == []


def test_a_version_no_store_holds_is_refused_naming_the_versions_present(cli: Cli, tmp_path: Path) -> None:
    """`--to 2.28.1001.0` with the store holding 2.28.1001.0+0badc0de: exit 2 before any entry is
    read, naming the versions present and the build it likely meant, never "0% ready"."""
    store = tmp_path / "store"
    assert cli.json(*warm_args(store, buckets="128", graphs=1))["ok"]
    cli.bump(V2)
    assert cli.json("rewarm", "--from-compiler", V1, "--store", str(store), "-q")["ok"]
    release = V2.split("+")[0]
    for args, option, typed in ((["--from", V1, "--to", release], "--to", release),
                                (["--from", V1.split("+")[0], "--to", V2], "--from", V1.split("+")[0]),
                                (["--from", V1, "--to", "2.99.0.0+ffffffff"], "--to", "2.99.0.0+ffffffff")):
        proc = cli.run("upgrade-report", *args, "--store", str(store))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()  # no progress line: refused before reading
        assert f"{option} {typed}: no entries of that compiler" in line
        assert f"versions present: {V1}, {V2}" in line
        assert ("did you mean" in line) is (typed != "2.99.0.0+ffffffff")
    ok = cli.run("upgrade-report", "--from", V1, "--to", V2, "--store", str(store), "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["readiness"] == 1.0
