"""`neffcache why-miss` as a user runs it: real processes, the simulated toolchain, real stores.

The end-to-end case is the one operators hit: a store warmed with one set of flags, a job run
with one flag more (`neffcache run --report`), and the report explained: every graph the job
missed is named with the flag that drifted and the entry that would have hit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runtime_caches import VERSION, write_runtime_a
from tests.server.conftest import free_port
from tests.simulation import Sim
from tests.warmers.conftest import INSTANCE, V1, V2, WORKLOAD, Cli, warm_args

FLAGS = "--model-type=transformer"
V22 = "2.22.4455.0+0123abcd"


@pytest.fixture
def cli(sim: Sim) -> Cli:
    return Cli(sim)


def test_a_run_report_is_explained_flag_by_flag(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    warmed = cli.run(*warm_args(store, graphs=2, buckets="128"), NEURON_CC_FLAGS=FLAGS)
    assert warmed.returncode == 0, warmed.stderr
    report = tmp_path / "run-report.json"
    job = cli.run("run", "--instance", INSTANCE, "--store", str(store), "--report", str(report), "--",
                  *WORKLOAD, "--model", "llama-tiny", "--bucket", "128", "--graphs", "2",
                  NEURON_CC_FLAGS=f"{FLAGS} --enable-fast-loading-neuron-binaries")
    assert job.returncode == 0, job.stderr
    assert f"why: neffcache why-miss --from-report {report}" in job.stderr
    graphs = json.loads(report.read_text())["graphs"]
    assert len(graphs) == 2 and {g["status"] for g in graphs} == {"compiled"}
    assert all(g["flags"] == [FLAGS, "--enable-fast-loading-neuron-binaries"] and len(g["hlo_sha256"]) == 64
               for g in graphs)

    data = cli.json("why-miss", "--from-report", str(report), "--store", str(store))
    explained = data["graphs"]
    assert [g["cause"] for g in explained] == ["flag `--enable-fast-loading-neuron-binaries` added"] * 2
    for g in explained:
        assert g["held"] == [f"file://{store}"]  # compiled by the job since: held now
        nearest = g["nearest"][0]
        assert nearest["entry"]["flags"] == [FLAGS] and nearest["differing"] == ["flags"]
        assert nearest["flags_diff"]["added"] == ["--enable-fast-loading-neuron-binaries"]
        assert g["fix"].startswith(f"rerun with the flags of entry {nearest['entry']['path']}: `{FLAGS}`")
    text = cli.run("why-miss", "--from-report", str(report), "--store", str(store))
    assert text.returncode == 0, text.stderr
    assert text.stdout.count("likely cause: flag `--enable-fast-loading-neuron-binaries` added") == 2
    assert "+ --enable-fast-loading-neuron-binaries" in text.stdout
    assert "2 missed graphs explained" in text.stdout


@pytest.mark.parametrize(("warmed_with", "run_with", "cause"), [
    ((V1, INSTANCE), (V2, INSTANCE), "compiler 2.27 → 2.28"),
    (("2.15.128.0+56dc5a86", INSTANCE), ("2.16.372.0+0badc0de", INSTANCE),
     "compiler 2.15 → 2.16; flags-file form list → target (same flags, new suffix)"),
    ((V1, "trn1.32xlarge"), (V1, INSTANCE), "target trn1 vs trn2; LNC 1 vs 2"),
], ids=["compiler-bump", "flags-form", "target"])
def test_a_toolchain_drift_between_warm_and_run(cli: Cli, tmp_path: Path, warmed_with: tuple[str, str],
                                                run_with: tuple[str, str], cause: str) -> None:
    store, report = tmp_path / "store", tmp_path / "run-report.json"
    cli.bump(warmed_with[0])
    warmed = cli.run(*warm_args(store, "--instance", warmed_with[1], graphs=1, buckets="128"), NEURON_CC_FLAGS=FLAGS)
    assert warmed.returncode == 0, warmed.stderr
    cli.bump(run_with[0])
    job = cli.run("run", "--instance", run_with[1], "--store", str(store), "--report", str(report), "--",
                  *WORKLOAD, "--model", "llama-tiny", "--bucket", "128", "--graphs", "1", NEURON_CC_FLAGS=FLAGS)
    assert job.returncode == 0, job.stderr
    (graph,) = cli.json("why-miss", "--from-report", str(report), "--store", str(store))["graphs"]
    assert graph["cause"] == cause, json.dumps(graph, indent=1)
    assert graph["nearest"][0]["entry"]["compiler_version"] == warmed_with[0]


def test_a_key_explained_in_text_and_json(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    old = write_runtime_a(store / "trn2-lnc2", b"HloModule step", version=VERSION, flags=FLAGS, target="trn2")
    proc = cli.run("why-miss", old.name, "--store", str(store), "--instance", INSTANCE, "--compiler-version", V22)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{old.name} (looked for at trn2-lnc2/neuronxcc-{V22}/{old.name})"
    assert "  likely cause: compiler 2.21 → 2.22" in lines
    assert "  index: not configured: the index was not asked (answered from the stores)" in lines
    data = cli.json("why-miss", old.name, "--store", str(store), "--instance", INSTANCE, "--compiler-version", V22)
    (graph,) = data["graphs"]
    assert graph["missed"]["path"] == f"trn2-lnc2/neuronxcc-{V22}/{old.name}"
    assert {d["field"]: d["match"] for d in graph["nearest"][0]["differences"]} == {
        "layout": "same", "hlo": "same", "compiler": "different", "key_rule": "same", "target": "same", "lnc": "same",
        "flags": "same"}
    # The job's namespace holds nothing: its flags form came from the version table, and it says so.
    assert (graph["missed"]["flags_form"], graph["missed"]["flags_form_rule"]) == ("target", "version table")
    assert f"  keys compared under: trn2-lnc2/neuronxcc-{V22}: flags form target (version table): " \
           f"no entry says the flags form: the version table gives target for neuronx-cc {V22}" in lines


def test_with_the_index_down_it_answers_from_the_stores(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    old = write_runtime_a(store / "trn2-lnc1", b"HloModule step", version=VERSION, flags=FLAGS, target="trn2")
    down = f"http://127.0.0.1:{free_port()}"
    data = cli.json("why-miss", f"trn2-lnc2/neuronxcc-{VERSION}/{old.name}", "--store", str(store),
                    "--index-url", down, "--token", "nfc_x")
    (graph,) = data["graphs"]
    assert graph["cause"] == "LNC 1 vs 2"
    assert graph["index"].startswith(f"{down} did not answer") and graph["index"].endswith("from the stores only")


@pytest.mark.parametrize(("content", "says"), [
    ("{broken", "is not JSON"),
    (json.dumps({"graphs": [{"path": "../../../../etc/shadow", "layout": "x", "namespace": "", "key": "k"}]}),
     "'..' is not allowed"),
    (json.dumps([{"path": "a/b", "layout": "x", "namespace": "", "key": "k" * 10_000_000}]), "'key' must be"),
])
def test_a_hostile_report_is_one_line_and_exit_2(cli: Cli, tmp_path: Path, content: str, says: str) -> None:
    report = tmp_path / "report.json"
    report.write_text(content)
    proc = cli.run("why-miss", "--from-report", str(report), "--store", str(tmp_path / "store"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neffcache: configuration error: report") and says in lines[0]
    assert len(lines[0]) < 600 and proc.stdout == ""


def test_it_needs_one_graph_and_somewhere_to_look(cli: Cli, tmp_path: Path) -> None:
    proc = cli.run("why-miss", "--store", str(tmp_path))
    assert proc.returncode == 2 and "name one graph" in proc.stderr
    proc = cli.run("why-miss", "MODULE_1+e30acd3a")
    assert proc.returncode == 2 and "name a store to look in" in proc.stderr
    help_text = cli.run("why-miss", "--help").stdout
    assert "Examples:" in help_text and "--from-report" in help_text and "--json" in help_text


@pytest.mark.parametrize(("env", "cause", "fix"), [
    ({"NEURON_COMPILER_OPT_LEVEL": "-O2"}, "NEURON_COMPILER_OPT_LEVEL `-O1` → `-O2`: part of every torchneuron key",
     "NEURON_COMPILER_OPT_LEVEL=-O1 NEURON_CC_FLAGS=--model-type=transformer"),
    ({"NEURON_CC_FLAGS": f"{FLAGS} --auto-cast=none"},
     f"NEURON_CC_FLAGS `{FLAGS}` → `{FLAGS} --auto-cast=none`: part of every torchneuron key",
     "NEURON_COMPILER_OPT_LEVEL=-O1 NEURON_CC_FLAGS=--model-type=transformer"),
], ids=["opt-level", "cc-flags"])
def test_a_torchneuron_job_whose_key_settings_drifted(cli: Cli, tmp_path: Path, env: dict[str, str], cause: str,
                                                      fix: str) -> None:
    """TorchNeuron's C++ key covers NEURON_COMPILER_OPT_LEVEL and NEURON_CC_FLAGS: a job run with
    other values than the warm-up's recompiles every graph, and why-miss names the variable."""
    store, report = tmp_path / "store", tmp_path / "run-report.json"
    warmed = cli.run(*warm_args(store, graphs=1, buckets="128", backend="native"), NEURON_CC_FLAGS=FLAGS)
    assert warmed.returncode == 0, warmed.stderr
    job = cli.run("run", "--instance", INSTANCE, "--store", str(store), "--report", str(report), "--",
                  *WORKLOAD, "--model", "llama-tiny", "--bucket", "128", "--graphs", "1", "--backend", "native",
                  **{"NEURON_CC_FLAGS": FLAGS, **env})
    assert job.returncode == 0, job.stderr
    assert json.loads(report.read_text())["compile"] == 1
    (graph,) = cli.json("why-miss", "--from-report", str(report), "--store", str(store))["graphs"]
    assert graph["cause"] == cause
    assert graph["fix"].endswith(fix), graph["fix"]
    settings = {s["variable"]: s for s in graph["nearest"][0]["settings"]}
    assert set(settings) == {"NEURON_COMPILER_OPT_LEVEL", "NEURON_CC_FLAGS"}
    assert [name for name, s in settings.items() if s["found"] != s["wanted"]] == list(env)
