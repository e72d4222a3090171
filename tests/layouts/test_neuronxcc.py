"""The neuronxcc runtime facts (docs/runtimes.md, "neuronxcc"): flags file and suffix by era, states, log lines."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from neffcache.application.jobenv import job_env
from neffcache.entry import EntryState, Namespace
from neffcache.layouts import LAYOUTS, get_layout
from neffcache.layouts.flags import (
    FLAGS_JSON,
    FLAGS_TXT,
    LIST,
    TARGET,
    TEXT,
    FlagsFileError,
    flags_file,
    form_by_version,
    read_flags_file,
    suffix_of,
    suffix_problem,
    user_flags,
)
from neffcache.layouts.neuronxcc import NeuronxccLayout
from neffcache.layouts.records import LogLine
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from neffcache.toolchain import Toolchain

_LAYOUT = get_layout("neuronxcc")
assert isinstance(_LAYOUT, NeuronxccLayout)
LAYOUT: NeuronxccLayout = _LAYOUT


# -- flags file and suffix --------------------------------------------------------------------
def test_documented_suffixes() -> None:
    assert suffix_of(b"--model-type=transformer") == "abb26765"
    assert suffix_of(b"") == "d41d8cd9"
    assert suffix_of(json.dumps(["--target=trn1"]).encode()) == "e30acd3a"
    assert flags_file(TEXT, None, ["--model-type=transformer"]) == (FLAGS_TXT, b"--model-type=transformer")
    assert suffix_of(flags_file(TARGET, "trn1", [])[1]) == "e30acd3a"


def test_real_trn2_lnc2_entry_839ddec0() -> None:
    # neuronxcc-2.26.6360.0+6f180f47/MODULE_18108742649528384371+839ddec0 on trn2, LNC 2, with
    # NEURON_CC_FLAGS="--model-type=transformer --optlevel=1 --enable-saturate-infinity --lnc=2".
    flags = ["--model-type=transformer", "--optlevel=1", "--enable-saturate-infinity", "--lnc=2"]
    answer = form_by_version("2.26.6360.0+6f180f47")
    assert answer is not None
    name, data = flags_file(answer.form, "trn2", flags)
    assert name == FLAGS_JSON and suffix_of(data) == "839ddec0"
    assert suffix_of(json.dumps(["--target=trn2", "--lnc=2"]).encode()) != "839ddec0"
    assert read_flags_file(name, data) == (flags, "trn2")


def test_wrapper_options_never_reach_the_file() -> None:
    flags = ["--cache_dir=/x", "--model-type=transformer", "--retry_failed_compilation", "--cache_dir", "/y", "-O1"]
    assert user_flags(flags) == ["--model-type=transformer", "-O1"]
    assert flags_file(LIST, "trn2", flags)[1] == b'["--model-type=transformer", "-O1"]'
    with pytest.raises(FlagsFileError):
        flags_file(TARGET, None, flags)


def test_read_flags_file_each_form_and_bad_files() -> None:
    assert read_flags_file(FLAGS_TXT, b"--model-type=transformer -O1") == (["--model-type=transformer", "-O1"], None)
    assert read_flags_file(FLAGS_JSON, b'["-O1"]') == (["-O1"], None)
    assert read_flags_file(FLAGS_JSON, b'["--target=trn1", "-O1"]') == (["-O1"], "trn1")
    # The 2.15.141.0 anomaly: the flag string in a JSON-era namespace.
    assert read_flags_file(FLAGS_JSON, b"--model-type=transformer -O1") == (["--model-type=transformer", "-O1"], None)
    for bad in (b"{", b'{"a": 1}', b"[1]", b"\x00\xff binary"):
        with pytest.raises(FlagsFileError):
            read_flags_file(FLAGS_JSON, bad)
    with pytest.raises(FlagsFileError):
        read_flags_file(FLAGS_TXT, b"\xff\xfe")


def test_suffix_check() -> None:
    data = json.dumps(["--target=trn1"]).encode()
    assert suffix_problem("MODULE_123+e30acd3a", data) is None
    problem = suffix_problem("MODULE_123+abb26765", data)
    assert problem and "does not match the MODULE name" in problem
    assert LAYOUT.flags_problem("MODULE_1+e30acd3a", None)


def test_key_for_recomputes_the_suffix_across_forms() -> None:
    old = Namespace("neuronxcc", "trn2-lnc2/neuronxcc-2.15.128.0+a", "2.15.128.0+a", "trn2", 2)
    new = Namespace("neuronxcc", "trn2-lnc2/neuronxcc-2.16.372.0+b", "2.16.372.0+b", "trn2", 2)
    name, data = LAYOUT.flags_file(old, "", ["--model-type=transformer"])
    key = f"MODULE_42+{suffix_of(data)}"
    got = LAYOUT.key_for(key, name, data, new)
    assert got is not None
    new_key, new_name, new_data = got
    assert new_data == json.dumps(["--target=trn2", "--model-type=transformer"]).encode()
    assert (new_key, new_name) == (f"MODULE_42+{suffix_of(new_data)}", FLAGS_JSON)
    assert LAYOUT.key_for(key, name, data, old) == (key, name, data)  # within a form: unchanged
    # The decided form, not the version, names the successor: a 2.16.372.0 namespace in list form.
    assert LAYOUT.key_for(key, name, data, dataclasses.replace(new, flags_form="list")) == (key, name, data)
    text = LAYOUT.key_for(key, name, data, dataclasses.replace(new, flags_form="text"))
    assert text == ("MODULE_42+abb26765", FLAGS_TXT, b"--model-type=transformer")
    with pytest.raises(FlagsFileError, match="does not match"):
        LAYOUT.key_for("MODULE_42+00000000", name, data, new)
    with pytest.raises(FlagsFileError, match="trn1"):
        LAYOUT.key_for("MODULE_42+e30acd3a", FLAGS_JSON, b'["--target=trn1"]', new)
    assert LAYOUT.names(Namespace("neuronxcc", "neuronxcc-2.13.1", "2.13.1"), key).flags == FLAGS_TXT


def test_the_text_form_is_committed_by_its_neff() -> None:
    text_ns = Namespace("neuronxcc", "neuronxcc-2.14.227.0+2d4f85be", "2.14.227.0+2d4f85be", flags_form="text")
    list_ns = dataclasses.replace(text_ns, flags_form="list")
    assert text_ns == list_ns  # the form is no part of the namespace's identity
    assert (LAYOUT.names(text_ns, "MODULE_1+a").marker, LAYOUT.names(list_ns, "MODULE_1+a").marker) == (
        "model.neff", "model.done")
    assert LAYOUT.plan_entry(text_ns, "MODULE_1+a").marker_name == "model.neff"
    # What is published decides: a text flags file alone commits by the NEFF, a JSON one by model.done.
    assert LAYOUT.publish_plan(list_ns, "MODULE_1+a", [FLAGS_TXT, "model.neff"]).marker_name == "model.neff"
    assert LAYOUT.publish_plan(text_ns, "MODULE_1+a", [FLAGS_JSON, "model.neff"]).marker_name == "model.done"
    assert LAYOUT.publish_plan(text_ns, "MODULE_1+a", ["model.neff"]).marker_name == "model.neff"


# -- states -----------------------------------------------------------------------------------
def _entry(root: Path, key: str, *names: str) -> None:
    d = root / "neuronxcc-2.21.33363.0+82129205" / key
    d.mkdir(parents=True)
    for n in names:
        (d / n).write_bytes(b"x" if n in ("model.neff", "model.hlo_module.pb", "model.hlo.pb") else b"")


def test_state_precedence_extras_and_old_hlo(tmp_path: Path) -> None:
    lock = "model.hlo_module.pb.lock"
    _entry(tmp_path, "MODULE_1+a", "model.hlo_module.pb", "compile_flags.json", "model.neff", "model.done", lock)
    _entry(tmp_path, "MODULE_2+a", "model.hlo_module.pb", "model.log", lock)
    _entry(tmp_path, "MODULE_3+a", "model.hlo_module.pb", lock)
    _entry(tmp_path, "MODULE_4+a", "model.hlo.pb", "compile_flags.txt")
    _entry(tmp_path, "MODULE_5+a", "model.hlo_module.pb", "compile_flags.json", "model.neff", "model.done",
           "wrapped_neff.hlo")
    _entry(tmp_path, "MODULE_6+a", "model.hlo_module.pb", "wrapped_neff.hlo")
    report = scan(LocalStore(tmp_path))
    entries = {e.key: e for e in report.entries}
    assert {k: e.state for k, e in entries.items()} == {
        "MODULE_1+a": EntryState.SUCCESS, "MODULE_2+a": EntryState.FAILED, "MODULE_3+a": EntryState.LOCKED,
        "MODULE_4+a": EntryState.EMPTY, "MODULE_5+a": EntryState.SUCCESS, "MODULE_6+a": EntryState.EMPTY}
    stale = entries["MODULE_1+a"]
    assert LAYOUT.locks_of(stale) == (lock,) and any("stale lock" in p for p in stale.problems)
    assert LAYOUT.hlo_of(entries["MODULE_4+a"]) == "model.hlo.pb"
    # NxD writes wrapped_neff.hlo beside model.neff as the second result of its compile: the
    # entry's own file (copied and removed with it, covered by its manifest), not a problem.
    assert "wrapped_neff.hlo" in entries["MODULE_5+a"].files and not entries["MODULE_5+a"].problems
    assert LAYOUT.payload_names(entries["MODULE_5+a"]) >= {"model.neff", "model.done", "wrapped_neff.hlo"}
    assert report.foreign == ()


# -- log lines --------------------------------------------------------------------------------
MOD = "MODULE_18108742649528384371+839ddec0"
ROOT = "/var/tmp/neuron-compile-cache/neuronxcc-2.26.6360.0+6f180f47"
WORK = "/tmp/ubuntu/neuroncc_compile_workdir/4f1e1c2a-3b5d-4c6e-9f70-8a9b0c1d2e3f"
PREFIX = "2026-03-02 10:11:12.000123:  4242  "
LINES = [
    (f"{PREFIX}INFO ||NEURON_CC_WRAPPER||: Using a cached neff at {ROOT}/{MOD}/model.neff. "
     "Exiting with a successfully compiled graph.", "hit", f"{ROOT}/{MOD}/model.neff"),
    (f"{PREFIX}INFO ||NEURON_CC_WRAPPER||: Call compiler with cmd: neuronx-cc compile --framework=XLA "
     f"{WORK}/model.{MOD}.hlo_module.pb --output {WORK}/model.{MOD}.neff --target=trn2 "
     "--model-type=transformer --lnc=2 --verbose=35", "compile", f"{WORK}/model.{MOD}.hlo_module.pb"),
    ("INFO ||NEURON_CC_WRAPPER||: Call compiler with cmd: neuronx-cc compile --framework=XLA "
     "/tmp/nxd_model/context_encoding_model/_tp0_bk0/model.MODULE_0123456789abcdef0123+4a5b6c7d.hlo_module.pb "
     "--output /tmp/nxd_model/context_encoding_model/_tp0_bk0/model.MODULE_0123456789abcdef0123+4a5b6c7d.neff "
     "--target=trn2 --verbose=35", "compile",
     "/tmp/nxd_model/context_encoding_model/_tp0_bk0/model.MODULE_0123456789abcdef0123+4a5b6c7d.hlo_module.pb"),
    ("2023-09-01 10:00:00.000000: INFO ||NEURON_CC_WRAPPER||: Call compiler with cmd: ['neuronx-cc', "
     f"'--target=trn1', 'compile', '--framework', 'XLA', '/tmp/ubuntu/neuroncc_compile_workdir/x/model.{MOD}.hlo.pb', "
     "'--output', '/tmp/ubuntu/neuroncc_compile_workdir/x/model.neff', '--verbose=35']", "compile",
     f"/tmp/ubuntu/neuroncc_compile_workdir/x/model.{MOD}.hlo.pb"),
    (f"{PREFIX}INFO ||NEURON_CC_WRAPPER||: Compilation Successfully Completed for model.{MOD}.hlo_module.pb",
     "success", f"model.{MOD}.hlo_module.pb"),
    (f"{PREFIX}ERROR ||NEURON_CC_WRAPPER||: Failed compilation with ['neuronx-cc', 'compile', '--framework=XLA', "
     f"'{WORK}/model.{MOD}.hlo_module.pb', '--output', '{WORK}/model.{MOD}.neff', '--target=trn2', "
     "'--verbose=35']: 2026-03-02T10:11:12Z [TEN404] Internal tensorizer error", "failure",
     f"{WORK}/model.{MOD}.hlo_module.pb"),
    (f"{PREFIX}ERROR ||NEURON_CC_WRAPPER||: Compilation failed for {WORK}/model.{MOD}.hlo_module.pb after 0 retries.",
     "failure", f"{WORK}/model.{MOD}.hlo_module.pb"),
    (f"{PREFIX}ERROR ||NEURON_CC_WRAPPER||: Got a cached failed neff at {ROOT}/{MOD}/model.neff. Will skip "
     "compilation, please set --retry_failed_compilation for recompilation.", "failure",
     f"{ROOT}/{MOD}/model.neff"),
]


@pytest.mark.parametrize(("line", "kind", "path"), LINES)
def test_every_real_log_line_form(line: str, kind: str, path: str) -> None:
    got = LAYOUT.parse_log_line(line)
    assert got is not None and (got.kind, got.path) == (kind, path)
    assert got.entry is not None and got.entry.startswith("MODULE_") and got.entry in path
    if "nxd_model" not in line:
        assert got.entry == MOD


def test_a_compile_call_is_a_miss_too_and_other_lines_are_nothing() -> None:
    line, _, path = LINES[1]
    assert LAYOUT.parse_log_lines(line) == [LogLine("miss", MOD, path), LogLine("compile", MOD, path)]
    for other in ("step 1/3: loss=2.0", "INFO ||NEURON_CC_WRAPPER||: Another process must be compiling x",
                  "[NEFF_CACHE] Cache HIT for key: aten::add_t0_(3, 3)"):
        assert LAYOUT.parse_log_line(other) is None and LAYOUT.parse_log_lines(other) == []


def test_md5_is_of_the_bytes() -> None:
    assert suffix_of(b"-O1") == hashlib.md5(b"-O1").hexdigest()[:8]


def test_entry_named_by_a_work_directory_file_only() -> None:
    assert LAYOUT.entry_named(f"{WORK}/model.{MOD}.hlo_module.pb") == MOD
    assert LAYOUT.entry_named(f"/tmp/u/neuroncc_compile_workdir/x/model.{MOD}.hlo.pb") == MOD
    assert LAYOUT.entry_named(f"/elsewhere/neuronxcc-2.21.1/{MOD}/model.neff") is None


@pytest.mark.parametrize(("version", "legacy"), [
    ("2.12.54.0+f631c2365", True), ("2.14.227.0+2d4f85be", True), ("2.20.2.0+7d2c1a3b", False),
    ("2.21.33363.0+82129205", False), ("2.27.5334.0+f702b353", False),
])
def test_runtime_entries_of_every_era_scan_and_pass_the_flags_check(tmp_path: Path, version: str,
                                                                    legacy: bool) -> None:
    from neffcache.layouts.flags_form import own_namespace
    from tests.runtime_caches import write_neuronxcc_entry

    for i, state in enumerate(("SUCCESS", "FAILED", "EMPTY", "LOCKED")):
        write_neuronxcc_entry(tmp_path, f"g{i}".encode(), version=version, state=state, legacy=legacy)
    store = LocalStore(tmp_path)
    report = scan(store)
    assert sorted(e.state.value for e in report.entries) == ["EMPTY", "FAILED", "LOCKED", "SUCCESS"]
    assert report.garbage == ()
    for entry in report.entries:
        name = LAYOUT.flags_of(entry)
        # 2.14.227.0 was shipped with two forms: the entry's own flags file says which (the
        # version table's guess, list, is wrong for a text-form runtime's entries).
        assert name is not None and name == LAYOUT.names(own_namespace(store, entry), entry.key).flags
        assert LAYOUT.flags_problem(entry.key, store.read_bytes(entry.store_path(name))) is None
        assert LAYOUT.read_user_flags(name, store.read_bytes(entry.store_path(name))) == ["--model-type=transformer"]


def test_a_cache_dir_in_neuron_cc_flags_is_layout_a_env_problem_for_env_and_doctor() -> None:
    """libneuronxla takes ``--cache_dir`` over NEURON_COMPILE_CACHE_URL: both spellings are
    named, other layouts see no problem, and ``job_env`` judges the environment it is given."""
    environ = {"NEURON_CC_FLAGS": "-O1 --cache_dir=/scratch/a --cache_dir /scratch/b"}
    problems = LAYOUTS["neuronxcc"].env_problems(environ)
    assert [p.variable for p in problems] == ["NEURON_CC_FLAGS", "NEURON_CC_FLAGS"]
    assert "--cache_dir=/scratch/a" in problems[0].message and "neffcache env" in problems[0].fix
    assert all(layout.env_problems(environ) == [] for name, layout in LAYOUTS.items() if name != "neuronxcc")
    assert LAYOUTS["neuronxcc"].env_problems({"NEURON_CC_FLAGS": "-O1"}) == []
    tc = Toolchain("2.21.33363.0+82129205", "trn2", 2)
    _, notes = job_env("/cache", tc, environ=environ)
    assert sum("overrides NEURON_COMPILE_CACHE_URL" in n for n in notes) == 2
    _, quiet = job_env("/cache", tc, environ={})
    assert not any("overrides NEURON_COMPILE_CACHE_URL" in n for n in quiet)


def test_a_warm_up_drops_cache_dir_in_both_spellings_and_adds_retry_once() -> None:
    layout = LAYOUTS["neuronxcc"]
    env = {"NEURON_CC_FLAGS": "-O1 --cache_dir=/a --cache_dir /b --model-type=transformer"}
    changes, notes = layout.compile_only_env(env, retry_failed=True)
    assert changes == {"NEURON_CC_FLAGS": "-O1 --model-type=transformer --retry_failed_compilation"}
    assert notes and "--cache_dir" in notes[0]
    again, _ = layout.compile_only_env({"NEURON_CC_FLAGS": changes["NEURON_CC_FLAGS"] or ""}, retry_failed=True)
    assert again == changes  # idempotent: the retry flag is not added twice
    assert layout.compile_only_env({"NEURON_CC_FLAGS": "--cache_dir=/a"}, retry_failed=False) == (
        {"NEURON_CC_FLAGS": None}, ["removed --cache_dir from NEURON_CC_FLAGS: the warm-up writes to the namespace"])
    # The other runtimes leave libneuronxla's flags alone (vLLM sets its own CPU-compile variables).
    assert all("NEURON_CC_FLAGS" not in other.compile_only_env(env, retry_failed=True)[0]
               for name, other in LAYOUTS.items() if name != "neuronxcc")
