"""The neuronx-cc stand-in, run as a real executable through the shim."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import time
from pathlib import Path

import pytest

from neffcache.testing.compiler import UsageError, parse_compile_args
from neffcache.testing.hlo import make_hlo
from neffcache.testing.neff import read_neff_header
from neffcache.testing.shim import install_compiler_shim
from neffcache.toolchain import parse_compiler_version
from tests.simulation import Sim


@pytest.fixture
def hlo_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.hlo_module.pb"
    path.write_bytes(make_hlo("llama-tiny", 128, 0, 20_000))
    return path


def _neff(sim: Sim, hlo: Path, name: str, *flags: str, **env: str) -> bytes:
    out = sim.root / f"{name}.neff"
    proc = sim.compile("compile", str(hlo), *flags, "--output", str(out), **env)
    assert proc.returncode == 0, proc.stderr
    return out.read_bytes()


def test_version_output_parses(sim: Sim) -> None:
    proc = sim.compile("--version")
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0] == "NeuronX Compiler version 2.27.5334.0+f702b353"
    assert "Python version" in proc.stdout and "(simulated by neffcache.testing)" in proc.stdout
    assert parse_compiler_version(proc.stdout) == "2.27.5334.0+f702b353"
    # The baked version is a default: the caller's environment wins.
    other = sim.compile("--version", NEFFSIM_COMPILER_VERSION="2.28.1.0+deadbeef")
    assert parse_compiler_version(other.stdout) == "2.28.1.0+deadbeef"


def test_shim_bakes_settings(tmp_path: Path) -> None:
    shim = install_compiler_shim(tmp_path / "b", version="2.19.0.1+aaa", fail_match="it's a 'quote'")
    text = shim.read_text()
    assert "SIMULATION" in text and "2.19.0.1+aaa" in text
    proc = subprocess.run([str(shim), "--version"], capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin"})
    assert parse_compiler_version(proc.stdout) == "2.19.0.1+aaa"
    with pytest.raises(ValueError, match="not a valid compiler version"):
        install_compiler_shim(tmp_path / "b", version="../evil")


def test_compile_is_deterministic_and_depends_on_codegen_inputs(sim: Sim, hlo_file: Path) -> None:
    base = ("--framework", "XLA", "--target", "trn2")
    first = _neff(sim, hlo_file, "a", *base, "--model-type=transformer", "--auto-cast", "none")
    # Same inputs in another spelling and order, other output path and verbosity: same bytes.
    same = _neff(sim, hlo_file, "b", "--auto-cast=none", "--target=trn2", "--framework=XLA",
                 "--model-type", "transformer", "--verbose=35", "--lnc", "2")
    assert first == same
    header = read_neff_header(first)
    assert header is not None
    assert header["hlo_sha256"] == hashlib.sha256(hlo_file.read_bytes()).hexdigest()
    assert (header["target"], header["lnc"], header["graph"]) == ("trn2", 2, "llama-tiny/b128/g0")
    variants = {
        _neff(sim, hlo_file, "c", *base),  # flags
        _neff(sim, hlo_file, "d", *base, "--model-type=transformer", "--auto-cast=none", "-O3"),
        _neff(sim, hlo_file, "e", "--framework=XLA", "--target=trn1", "--model-type=transformer",
              "--auto-cast=none"),  # target
        _neff(sim, hlo_file, "f", *base, "--lnc=1", "--model-type=transformer", "--auto-cast=none"),
        _neff(sim, hlo_file, "g", *base, "--model-type=transformer", "--auto-cast=none",
              NEFFSIM_COMPILER_VERSION="2.28.0.0+1"),  # version
    }
    assert first not in variants and len(variants) == 5


def test_usage_errors_exit_2(sim: Sim, hlo_file: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "x.neff")
    missing_input = sim.compile("compile", "--framework", "XLA", "--target", "trn2", "--output", out)
    assert missing_input.returncode == 2 and "model.hlo_module.pb" in missing_input.stderr
    bad_target = sim.compile("compile", str(hlo_file), "--framework=XLA", "--target=trn9", "--output", out)
    assert bad_target.returncode == 2 and "trn9" in bad_target.stderr
    no_file = sim.compile("compile", str(tmp_path / "nope.pb"), "--framework=XLA", "--target=trn1",
                          "--output", out)
    assert no_file.returncode == 2 and "nope.pb" in no_file.stderr
    assert not Path(out).exists()
    assert sim.compile("link").returncode == 2


def test_parse_tolerates_unknown_flags() -> None:
    req = parse_compile_args(["in.pb", "--framework=XLA", "--target", "trn1n", "--enable-x",
                              "--pipeline", "compile", "-O2", "--output", "o.neff", "--verbose", "35"])
    assert (req.input, req.target, req.lnc, req.output) == ("in.pb", "trn1n", 1, "o.neff")
    assert req.codegen_flags == ["--enable-x", "--framework=XLA", "--pipeline=compile", "-O2"]
    with pytest.raises(UsageError, match="expected one argument"):
        parse_compile_args(["in.pb", "--framework=XLA", "--target"])
    with pytest.raises(UsageError, match="invalid choice"):
        parse_compile_args(["in.pb", "--framework=XLA", "--target=trn2", "--lnc=4"])


def test_failure_writes_no_neff_and_invocations_are_logged(sim: Sim, hlo_file: Path) -> None:
    out = sim.root / "fail.neff"
    proc = sim.compile("compile", str(hlo_file), "--framework=XLA", "--target=trn2", "--output", str(out),
                       NEFFSIM_FAIL_MATCH=r"b128/g0$")
    assert proc.returncode == 1
    assert "ERROR" in proc.stderr and "llama-tiny/b128/g0" in proc.stderr
    assert not out.exists() and not list(sim.root.glob(".fail.neff.*"))
    _neff(sim, hlo_file, "ok", "--framework=XLA", "--target=trn2")
    records = sim.compiles()
    assert [r["graph"] for r in records] == ["llama-tiny/b128/g0"] * 2
    assert records[0]["hlo_sha256"] == hashlib.sha256(hlo_file.read_bytes()).hexdigest()
    assert records[0]["version"] == "2.27.5334.0+f702b353" and records[0]["pid"] != records[1]["pid"]


def test_neff_size_and_per_graph_compile_time(sim: Sim, tmp_path: Path) -> None:
    hlo = tmp_path / "slow.pb"
    hlo.write_bytes(make_hlo("m", 1, 0, 15_000, compile_seconds=0.3))
    start = time.monotonic()
    neff = _neff(sim, hlo, "slow", "--framework=XLA", "--target=trn1", NEFFSIM_NEFF_BYTES="300000")
    assert time.monotonic() - start >= 0.3
    assert len(neff) == 300_000


def test_hung_compile_stops_promptly_on_sigterm(sim: Sim, hlo_file: Path) -> None:
    proc = subprocess.Popen(
        [str(sim.bin_dir / "neuronx-cc"), "compile", str(hlo_file), "--framework=XLA", "--target=trn2",
         "--output", str(sim.root / "hang.neff")],
        env={**sim.env, "NEFFSIM_HANG_MATCH": "llama"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    time.sleep(0.4)
    assert proc.poll() is None
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) != 0
    assert time.monotonic() - start < 1
    assert not (sim.root / "hang.neff").exists()


def _compile(sim: Sim, hlo: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return sim.compile("compile", str(hlo), "--framework", "XLA", "--target", "trn2", "--output",
                       str(sim.root / "out.neff"), **env)


def test_host_failures_fail_like_the_host(sim: Sim, hlo_file: Path) -> None:
    """SIMULATED host failures: SIGKILL (the OOM killer's signal), a MemoryError, a missing
    shared library (the loader's message, exit 127); each logs its invocation first and
    writes no NEFF."""
    killed = _compile(sim, hlo_file, NEFFSIM_KILL_MATCH="b128/g0")
    assert killed.returncode == -signal.SIGKILL and killed.stderr == ""
    oom = _compile(sim, hlo_file, NEFFSIM_OOM_MATCH="b128")
    assert oom.returncode == 1 and "MemoryError" in oom.stderr
    loader = _compile(sim, hlo_file, NEFFSIM_ENV_FAIL_MATCH="libfoo")
    assert loader.returncode == 127
    assert ("error while loading shared libraries: libfoo.so.1: cannot open shared object file: "
            "No such file or directory") in loader.stderr
    assert not (sim.root / "out.neff").exists()
    assert len(sim.compiles()) == 3
    assert _compile(sim, hlo_file, NEFFSIM_KILL_MATCH="b256").returncode == 0  # another graph: compiles


def test_a_compiler_error_names_the_input_path_and_a_line(sim: Sim, hlo_file: Path) -> None:
    proc = _compile(sim, hlo_file, NEFFSIM_FAIL_MATCH="b128")
    assert proc.returncode == 1
    assert f"at {hlo_file}:" in proc.stderr and "[NCC_ESIM001]" in proc.stderr


def test_the_shim_bakes_the_host_faults(tmp_path: Path, hlo_file: Path) -> None:
    shim = install_compiler_shim(tmp_path / "bin", kill_match="b128", env_fail="libbar")
    text = shim.read_text()
    assert "NEFFSIM_KILL_MATCH=b128" in text and "NEFFSIM_ENV_FAIL_MATCH=libbar" in text
    broken = install_compiler_shim(tmp_path / "broken", python=str(tmp_path / "no-such-python"))
    proc = subprocess.run([str(broken), "--version"], capture_output=True, text=True, check=False)
    assert proc.returncode == 127  # a compiler that cannot start: the shell's "not found"
