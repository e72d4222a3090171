"""The recording neuronx-cc, installed as an executable script and run as the runtimes run it."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from neffcache.placeholder import read_placeholder
from neffcache.warmers.recorder import ENV_RECORDS, HLO_DIR, install_recorder, parse_compile, read_records

VERSION_TEXT = "NeuronX Compiler version 2.27.5334.0+f702b353\n\nPython version 3.11.9\n"


def run(exe: Path, *args: str, records: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", **({ENV_RECORDS: str(records)} if records is not None else {})}
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def test_it_answers_version_as_the_installed_compiler_does(tmp_path: Path) -> None:
    exe = install_recorder(tmp_path / "bin", VERSION_TEXT)
    proc = run(exe, "--version")
    assert proc.returncode == 0 and proc.stdout == VERSION_TEXT
    assert exe.stat().st_mode & 0o777 == 0o700


def test_a_compile_is_recorded_and_answered_with_a_placeholder(tmp_path: Path) -> None:
    exe = install_recorder(tmp_path / "bin", VERSION_TEXT)
    records, work = tmp_path / "records", tmp_path / "work"
    records.mkdir()
    work.mkdir()
    hlo = b"HLO of one graph" * 500
    (work / "model.MODULE_1+abc.hlo_module.pb").write_bytes(hlo)
    # libneuronxla's argument shape (fixed options first, user flags, --verbose last).
    proc = run(exe, "compile", "--framework=XLA", str(work / "model.MODULE_1+abc.hlo_module.pb"), "--output",
               str(work / "out.neff"), "--target=trn2", "--lnc=2", "--model-type", "transformer", "-O1",
               "--enable-fast-loading", "--verbose=35", records=records)
    assert proc.returncode == 0, proc.stderr
    digest = hashlib.sha256(hlo).hexdigest()
    header = read_placeholder((work / "out.neff").read_bytes())
    assert header is not None and (header["hlo_sha256"], header["hlo_size"]) == (digest, len(hlo))
    assert (records / HLO_DIR / digest).read_bytes() == hlo
    [line] = read_records(records)
    assert (line["hlo_sha256"], line["hlo_size"], line["target"], line["lnc"]) == (digest, len(hlo), "trn2", 2)
    assert line["flags"] == ["--model-type=transformer", "-O1", "--enable-fast-loading"]
    assert line["output"] == str(work / "out.neff")


def test_outside_a_plan_it_writes_nothing(tmp_path: Path) -> None:
    exe = install_recorder(tmp_path / "bin", VERSION_TEXT)
    (tmp_path / "g.pb").write_bytes(b"hlo")
    for records in (None, tmp_path / "missing"):
        proc = run(exe, "compile", str(tmp_path / "g.pb"), "--output", str(tmp_path / "out.neff"), "--target",
                   "trn1", records=records)
        assert proc.returncode == 1 and "only" in proc.stderr
        assert not (tmp_path / "out.neff").exists()
    assert run(exe, "help").returncode == 2


def test_the_native_argument_shape_and_unknown_options_with_values(tmp_path: Path) -> None:
    hlo = tmp_path / "k.hlo_module.pb"
    hlo.write_bytes(b"x")
    call = parse_compile([str(hlo), "--framework", "XLA", "--target", "trn2", "--lnc", "1", "--output",
                          "o.neff", "--some-knob", "7"])
    assert (call.input, call.output, call.target, call.lnc) == (str(hlo), "o.neff", "trn2", 1)
    assert call.flags == ("--some-knob", "7")
    with pytest.raises(ValueError, match="no input file"):
        parse_compile(["--target=trn2", str(tmp_path / "absent.pb")])
    with pytest.raises(ValueError, match="needs a value"):
        parse_compile([str(hlo), "--output"])
