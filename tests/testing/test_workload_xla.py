"""The simulated torch-xla workload against layout A (libneuronxla's cache)."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neffcache.testing.hlo import make_hlo
from neffcache.testing.neff import read_neff_header
from tests.simulation import Sim

VERSION_DIR = "neuronxcc-2.27.5334.0+f702b353"
HIT_RE = re.compile(r"INFO \|\|NEURON_CC_WRAPPER\|\|: Using a cached neff at (\S+)/model\.neff\. "
                    r"Exiting with a successfully compiled graph\.")
MISS_RE = re.compile(r"INFO \|\|NEURON_CC_WRAPPER\|\|: Call compiler with cmd: neuronx-cc compile --framework=XLA "
                     r"(\S+)/neuroncc_compile_workdir/[0-9a-f-]{36}/model\.(MODULE_\d+\+[0-9a-f]{8})\.hlo_module\.pb "
                     r"--output \S+ --target=(\S+) .* --verbose=35$", re.MULTILINE)
SUCCESS_RE = re.compile(r"INFO \|\|NEURON_CC_WRAPPER\|\|: Compilation Successfully Completed for "
                        r"model\.(MODULE_\d+\+[0-9a-f]{8})\.hlo_module\.pb$", re.MULTILINE)
SUMMARY_RE = re.compile(r"graphs=(\d+) hits=(\d+) compiled=(\d+) failed=(\d+) extracted=(\d+)")


def _summary_of(stderr: str) -> tuple[int, ...]:
    match = SUMMARY_RE.search(stderr)
    assert match, stderr
    return tuple(int(g) for g in match.groups())


def _summary(proc: subprocess.CompletedProcess[str]) -> tuple[int, ...]:
    return _summary_of(proc.stderr)


def _module(hlo: bytes, flags: str = "", *, target: str = "trn2", form: str = "target") -> str:
    """The MODULE name the runtime gives ``hlo``: md5 of the flags file, in the release's form."""
    graph = int.from_bytes(hashlib.sha256(hlo).digest()[:8], "big")
    data = {"text": flags, "list": json.dumps(flags.split()),
            "target": json.dumps([f"--target={target}", *flags.split()])}[form]
    return f"MODULE_{graph}+{hashlib.md5(data.encode()).hexdigest()[:8]}"


def test_second_run_hits_every_graph(sim: Sim) -> None:
    first = sim.run_workload("--graphs", "2", "--bucket", "128,256", "--hlo-bytes", "14000")
    assert first.returncode == 0, first.stderr
    assert "neffcache.testing: SIMULATED" in first.stderr
    assert _summary(first) == (4, 0, 4, 0, 0)
    misses = MISS_RE.findall(first.stderr)
    assert [target for _, _, target in misses] == ["trn2"] * 4
    # Compiled in a work directory under TMPDIR, named by the entry's MODULE name.
    assert {workdir for workdir, _, _ in misses} == {f"{sim.env['TMPDIR']}/{getpass.getuser()}"}
    assert sorted(m for _, m, _ in misses) == sorted(SUCCESS_RE.findall(first.stderr))
    assert not list((sim.root / "tmp").rglob("*.hlo_module.pb"))  # the work directories are gone
    second = sim.run_workload("--graphs", "2", "--bucket", "128", "--bucket", "256", "--hlo-bytes", "14000")
    assert _summary(second) == (4, 4, 0, 0, 0)
    hits = HIT_RE.findall(second.stderr)
    assert len(hits) == 4 and not MISS_RE.search(second.stderr)
    assert len(sim.compiles()) == 4
    root = sim.root / "xla-cache"
    assert (root / "lock").exists()
    expected = {str(root / VERSION_DIR / _module(make_hlo("llama-tiny", b, i, 14000)))
                for b in (128, 256) for i in range(2)}
    assert set(hits) == expected
    assert {m for _, m, _ in misses} == {Path(h).name for h in hits}


def test_entry_files_flags_hash_and_cache_dir_flag(sim: Sim) -> None:
    cache = sim.root / "flagged"
    proc = sim.run_workload("--graphs", "1", NEURON_CC_FLAGS=f"--model-type=transformer --cache_dir={cache}")
    assert proc.returncode == 0, proc.stderr
    hlo = make_hlo("llama-tiny", 128, 0, 20_000)
    entry = cache / VERSION_DIR / _module(hlo, "--model-type=transformer")
    assert sorted(p.name for p in entry.iterdir()) == [
        "compile_flags.json", "model.done", "model.hlo_module.pb", "model.neff"]
    assert (entry / "model.hlo_module.pb").read_bytes() == hlo
    assert json.loads((entry / "compile_flags.json").read_text()) == ["--target=trn2", "--model-type=transformer"]
    assert (entry / "model.done").stat().st_size == 0
    assert (entry / "model.done").stat().st_mtime_ns >= (entry / "model.neff").stat().st_mtime_ns
    header = read_neff_header((entry / "model.neff").read_bytes())
    assert header is not None and (header["target"], header["lnc"]) == ("trn2", 2)
    assert not (sim.root / "xla-cache").exists()  # --cache_dir wins over NEURON_COMPILE_CACHE_URL


TEXT_FILES = ["compile_flags.txt", "model.hlo_module.pb", "model.neff"]
JSON_FILES = ["compile_flags.json", "model.done", "model.hlo_module.pb", "model.neff"]


@pytest.mark.parametrize(("version", "release", "form", "files"), [
    ("2.13.72.0+7a3b8c9d", "", "text", TEXT_FILES),
    ("2.14.227.0+2d4f85be", "text", "text", TEXT_FILES),  # SDK 2.19.0
    ("2.14.227.0+2d4f85be", "list", "list", JSON_FILES),  # SDK 2.19.1, the same compiler
    ("2.14.227.0+2d4f85be", "", "list", JSON_FILES),
    ("2.15.128.0+56dc5a86", "", "list", JSON_FILES),
    ("2.16.344.0+0a0b0c0d", "", "list", JSON_FILES),
    ("2.16.345.0+0a0b0c0d", "", "target", JSON_FILES),
    ("2.16.372.0+0a0b0c0d", "list", "list", JSON_FILES),
    ("2.21.33363.0+82129205", "", "target", JSON_FILES),
])
def test_flags_file_and_suffix_follow_the_release(sim: Sim, version: str, release: str, form: str,
                                                  files: list[str]) -> None:
    flags = "--model-type=transformer"
    env = {"NEFFSIM_COMPILER_VERSION": version, "NEURON_CC_FLAGS": flags, "NEFFSIM_FLAGS_FORM": release}
    proc = sim.run_workload("--graphs", "1", **env)
    assert proc.returncode == 0, proc.stderr
    assert f"flags_form={form}" in proc.stderr
    entry = sim.root / "xla-cache" / f"neuronxcc-{version}" / _module(make_hlo("llama-tiny", 128, 0, 20_000), flags,
                                                                      form=form)
    assert sorted(p.name for p in entry.iterdir()) == files
    if form == "text":
        assert entry.name.endswith("+abb26765")  # the documented md5 of this flag string
    again = sim.run_workload("--graphs", "1", **env)
    assert _summary(again)[1] == 1  # a hit


def test_an_unknown_flags_form_is_a_bad_configuration(sim: Sim) -> None:
    proc = sim.run_workload("--graphs", "1", NEFFSIM_FLAGS_FORM="json")
    assert proc.returncode == 2 and "NEFFSIM_FLAGS_FORM must be one of text, list, target" in proc.stderr


def test_instance_and_lnc_select_the_toolchain(sim: Sim) -> None:
    url = f"file://{sim.root / 'trn1-cache'}"
    proc = sim.run_workload("--graphs", "1", NEURON_RT_FAKE_INSTANCE_TYPE="trn1.32xlarge",
                            NEURON_COMPILE_CACHE_URL=url)
    assert proc.returncode == 0, proc.stderr
    [(_, module, target)] = MISS_RE.findall(proc.stderr)
    assert target == "trn1"
    assert module == _module(make_hlo("llama-tiny", 128, 0, 20_000), target="trn1")  # the target is in the key
    proc = sim.run_workload("--graphs", "1", NEURON_LOGICAL_NC_CONFIG="1",
                            NEURON_COMPILE_CACHE_URL=str(sim.root / "lnc1"))
    neff = next((sim.root / "lnc1").rglob("model.neff")).read_bytes()
    header = read_neff_header(neff)
    assert header is not None and (header["target"], header["lnc"]) == ("trn2", 1)


def test_extract_graphs_only_leaves_empty_entries(sim: Sim) -> None:
    proc = sim.run_workload("--graphs", "3", NEURON_EXTRACT_GRAPHS_ONLY="1")
    assert proc.returncode == 0, proc.stderr
    assert _summary(proc) == (3, 0, 0, 0, 3)
    entries = list((sim.root / "xla-cache" / VERSION_DIR).iterdir())
    assert len(entries) == 3
    for entry in entries:
        assert sorted(p.name for p in entry.iterdir()) == ["compile_flags.json", "model.hlo_module.pb"]
    assert sim.compiles() == []
    # A later real run compiles exactly those entries in place.
    again = sim.run_workload("--graphs", "3")
    assert _summary(again) == (3, 0, 3, 0, 0)
    assert sorted(p.name for p in entries) == sorted(p.name for p in entries[0].parent.iterdir())


def test_failed_graph_is_cached_until_retry(sim: Sim) -> None:
    failing = sim.run_workload("--graphs", "2", NEFFSIM_FAIL_MATCH="g1$")
    assert failing.returncode == 1
    assert _summary(failing) == (2, 0, 1, 1, 0)
    assert "ERROR ||NEURON_CC_WRAPPER||: Failed compilation with [" in failing.stderr
    [log] = list((sim.root / "xla-cache").rglob("model.log"))
    assert "llama-tiny/b128/g1" in log.read_text() and log.read_text().startswith("Failed compilation with [")
    assert re.search(r"ERROR \|\|NEURON_CC_WRAPPER\|\|: Compilation failed for \S+/neuroncc_compile_workdir/\S+/"
                     rf"model\.{re.escape(log.parent.name)}\.hlo_module\.pb after 0 retries\.", failing.stderr)
    assert not (log.parent / "model.neff").exists() and not (log.parent / "model.hlo_module.pb.lock").exists()

    cached = sim.run_workload("--graphs", "2")  # the compiler would succeed now, but is not asked
    assert cached.returncode == 1
    assert f"Got a cached failed neff at {log.parent}/model.neff. Will skip compilation, please set " \
           "--retry_failed_compilation for recompilation" in cached.stderr
    assert _summary(cached) == (2, 1, 0, 1, 0)
    assert len(sim.compiles()) == 2

    retried = sim.run_workload("--graphs", "2", NEURON_CC_FLAGS="--retry_failed_compilation")
    assert retried.returncode == 0, retried.stderr
    assert _summary(retried) == (2, 1, 1, 0, 0)
    assert not log.exists() and (log.parent / "model.done").exists()


def test_missing_or_unknown_instance_type(sim: Sim) -> None:
    env = dict(sim.env)
    del env["NEURON_RT_FAKE_INSTANCE_TYPE"]
    proc = subprocess.run([sys.executable, "-m", "neffcache.testing.workload"], env=env,
                          capture_output=True, text=True, check=False, timeout=30)
    assert proc.returncode == 2 and "NEURON_RT_FAKE_INSTANCE_TYPE" in proc.stderr
    unknown = sim.run_workload(NEURON_RT_FAKE_INSTANCE_TYPE="trn9.huge")
    assert unknown.returncode == 2 and "trn9.huge" in unknown.stderr
    bad_lnc = sim.run_workload(NEURON_LOGICAL_NC_CONFIG="3")
    assert bad_lnc.returncode == 2 and "NEURON_LOGICAL_NC_CONFIG" in bad_lnc.stderr
    s3 = sim.run_workload(NEURON_COMPILE_CACHE_URL="s3://bucket/prefix")
    assert s3.returncode == 2 and "not supported by the simulation" in s3.stderr
    no_compiler = sim.run_workload(PATH="/usr/bin:/bin")
    assert no_compiler.returncode == 2 and "neuronx-cc" in no_compiler.stderr


def test_stale_lock_is_waited_on_and_reported(sim: Sim) -> None:
    hlo = make_hlo("llama-tiny", 128, 0, 20_000)
    entry = sim.root / "xla-cache" / VERSION_DIR / _module(hlo)
    entry.mkdir(parents=True)
    (entry / "model.hlo_module.pb.lock").touch()  # left by a compile that was killed
    proc = sim.run_workload("--graphs", "1", NEFFSIM_LOCK_TIMEOUT="1", NEFFSIM_LOCK_LOG_SECONDS="0.3")
    assert proc.returncode == 1
    waiting = re.escape(f"INFO ||NEURON_CC_WRAPPER||: Another process must be compiling {entry}/"
                        "model.hlo_module.pb, been waiting for ") + r"\d+ seconds"
    assert re.search(waiting, proc.stderr), proc.stderr
    assert "Gave up waiting for the lock" in proc.stderr
    assert _summary(proc) == (1, 0, 0, 1, 0)
    assert sim.compiles() == []


def test_concurrent_workloads_compile_each_graph_once(sim: Sim) -> None:
    cmd = [sys.executable, "-m", "neffcache.testing.workload", "--graphs", "2"]
    env = {**sim.env, "NEFFSIM_COMPILE_SECONDS": "0.3", "NEFFSIM_LOCK_LOG_SECONDS": "0.1"}
    procs = [subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=30)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert len(sim.compiles()) == 2
    assert sum(_summary_of(o)[2] for o in outputs) == 2


def test_running_steps_crash_and_parallel(sim: Sim) -> None:
    env = {k: v for k, v in sim.env.items() if k != "TORCH_NEURONX_COMPILE_ONLY"}
    proc = subprocess.run([sys.executable, "-m", "neffcache.testing.workload", "--graphs", "1",
                           "--steps", "3"], env=env, capture_output=True, text=True, check=False, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(simulated)") == 3 and proc.stdout.startswith("step 1/3")
    crash = sim.run_workload("--graphs", "4", "--crash-after", "2")
    assert crash.returncode == 3 and _summary(crash) == (2, 1, 1, 0, 0)
    parallel = sim.run_workload("--graphs", "6", "--parallel", "3")
    assert parallel.returncode == 0, parallel.stderr
    assert _summary(parallel) == (6, 2, 4, 0, 0)  # g0 from the first run, g1 before the crash
    assert len(sim.compiles()) == 1 + 1 + 4


def test_sigterm_stops_a_hung_compile_and_cleans_up(sim: Sim) -> None:
    cmd = [sys.executable, "-m", "neffcache.testing.workload", "--graphs", "1"]
    proc = subprocess.Popen(cmd, env={**sim.env, "NEFFSIM_HANG_MATCH": "g0"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not sim.compiles() and time.monotonic() < deadline:
        time.sleep(0.02)
    [record] = sim.compiles()
    [lock] = list((sim.root / "xla-cache").rglob("model.hlo_module.pb.lock"))
    proc.terminate()
    _, stderr = proc.communicate(timeout=5)
    assert proc.returncode == 143, stderr
    assert not lock.exists() and not (lock.parent / "model.log").exists()
    # The compiler child died with the workload instead of hanging on as an orphan.
    pid = record["pid"]
    assert isinstance(pid, int)
    with pytest.raises(ProcessLookupError):  # killed and reaped, not a zombie
        os.kill(pid, 0)


def test_flags_option_overrides_neuron_cc_flags(sim: Sim) -> None:
    proc = sim.run_workload("--graphs", "1", "--flags=--model-type=transformer -O1",
                            NEURON_CC_FLAGS="--auto-cast=none")
    assert proc.returncode == 0, proc.stderr
    [flags_file] = list((sim.root / "xla-cache").rglob("compile_flags.json"))
    assert json.loads(flags_file.read_text()) == ["--target=trn2", "--model-type=transformer", "-O1"]
    assert flags_file.parent.name.endswith("+" + hashlib.md5(flags_file.read_bytes()).hexdigest()[:8])
