"""``neffcache failures`` and ``failures bundle``, as a user runs them: real subprocesses, the
simulated toolchain, a real index server (SQLite) on 127.0.0.1."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from neffcache.failures import signature
from tests.server.conftest import free_port
from tests.warmers.conftest import Cli, cli, index, warm_args  # noqa: F401 - fixtures
from tests.warmers.conftest import Index as LiveIndex

FAULT = "g1$"


def _warm(cli: Cli, store: Path, bucket: str, **faults: str) -> None:  # noqa: F811 - the fixture's type
    args = warm_args(store, "--two-phase", "--tag", "model=llama-tiny", "--tag", "team=ml", buckets=bucket, graphs=2)
    cli.json(*args, rc=1, **faults)


def _groups(cli: Cli, *args: str) -> dict[str, Any]:  # noqa: F811
    return cli.json("failures", *args)


def test_the_same_error_in_two_stores_is_one_signature(cli: Cli, tmp_path: Path) -> None:  # noqa: F811
    a, b = tmp_path / "a", tmp_path / "b"
    _warm(cli, a, "128", NEFFSIM_FAIL_MATCH=FAULT)
    _warm(cli, b, "256", NEFFSIM_FAIL_MATCH=FAULT)
    logs = [p.read_text() for p in (*a.rglob("model.log"), *b.rglob("model.log"))]
    assert len(logs) == 2 and str(a) in logs[0] and str(b) in logs[1]  # the errors name other paths
    data = _groups(cli, "--store", str(a), "--store", str(b))
    (group,) = data["groups"]
    assert (group["class"], group["graphs"], group["sources"]) == ("compiler", 2, ["store"])
    assert group["compiler_versions"] == ["2.27.5334.0+f702b353"]
    assert any("no index server configured" in n for n in data["notes"])
    assert _groups(cli, "--store", str(a), "--class", "environment")["groups"] == []
    text = cli.run("failures", "--store", str(a), "--store", str(b))
    assert text.returncode == 0 and group["signature"] in text.stdout
    # The hint runs as printed (from where the user is: -o is relative).
    (hint,) = [line.split(": ", 1)[1] for line in text.stdout.splitlines() if line.startswith("pack one for")]
    argv = shlex.split(hint)
    assert argv[0] == "neffcache"
    ran = subprocess.run(cli.argv(*argv[1:]), cwd=tmp_path, env=cli.environ(), capture_output=True, text=True,
                         timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr
    assert tarfile.is_tarfile(tmp_path / "repro.tar.gz")


def test_a_corrupt_entry_verify_found_is_filed_under_storage(cli: Cli, index: LiveIndex,  # noqa: F811
                                                             tmp_path: Path) -> None:
    """verify's disk corruption is its own class: not in `--class compiler`, never bundled."""
    store = tmp_path / "store"
    cli.json(*warm_args(store, buckets="128", graphs=1))
    (neff,) = store.rglob("*.neff")
    neff.write_bytes(b"bit rot")
    assert cli.run("verify", str(store)).returncode == 5
    fleet = _groups(cli)
    (group,) = fleet["groups"]
    assert (group["class"], group["cause"]) == ("storage", "corrupt-entry")
    assert _groups(cli, "--class", "compiler")["groups"] == []
    assert _groups(cli, "--class", "storage")["groups"] == [group]
    text = cli.run("failures").stdout
    assert "storage" in text and "pack one for the compiler team" not in text


def test_the_index_groups_what_every_host_reported(cli: Cli, index: LiveIndex, tmp_path: Path) -> None:  # noqa: F811
    a, b = tmp_path / "a", tmp_path / "b"
    _warm(cli, a, "128", NEFFSIM_FAIL_MATCH=FAULT)
    _warm(cli, b, "256", NEFFSIM_FAIL_MATCH=FAULT, NEFFSIM_KILL_MATCH="g0$")
    fleet = _groups(cli)  # no store named: the index alone
    by_class = {g["class"]: g for g in fleet["groups"]}
    compiler, env = by_class["compiler"], by_class["environment"]
    assert compiler["graphs"] == 2 and compiler["models"] == ["llama-tiny"] and compiler["teams"] == ["ml"]
    assert env["cause"] == "killed" and env["occurrences"] == 3  # every retry was an error event
    assert fleet["index"] == index.url and fleet["notes"] == []
    merged = _groups(cli, "--store", str(a))
    (store_and_index,) = [g for g in merged["groups"] if g["class"] == "compiler"]
    assert store_and_index["signature"] == compiler["signature"] and store_and_index["graphs"] == 2
    assert store_and_index["sources"] == ["index", "store"] and store_and_index["sample"]["source"] == "store"

    down = _groups(cli, "--store", str(a), "--index-url", f"http://127.0.0.1:{free_port()}")
    assert [g["signature"] for g in down["groups"]] == [compiler["signature"]]
    assert down["index"] is None and any("did not answer" in n and "from the stores only" in n
                                         for n in down["notes"])


def _readme_command(readme: str) -> str:
    match = re.search(r"```sh\n(.+?)\n```", readme, re.S)
    assert match, readme
    return match.group(1)


def test_a_bundle_unpacks_safely_and_reproduces_the_failure(cli: Cli, tmp_path: Path) -> None:  # noqa: F811
    store = tmp_path / "store"
    _warm(cli, store, "128", NEFFSIM_FAIL_MATCH=FAULT)
    (group,) = _groups(cli, "--store", str(store))["groups"]
    out = tmp_path / "out"
    out.mkdir()
    (out / "repro.tar.gz").write_text("an older bundle")
    made = cli.json("failures", "bundle", group["signature"][:6], "-o", str(out / "repro.tar.gz"),
                    "--store", str(store))
    assert made["signature"] == group["signature"] and sorted(p.name for p in out.iterdir()) == ["repro.tar.gz"]

    with tarfile.open(out / "repro.tar.gz") as tar:
        members = tar.getmembers()
        tops = {m.name.split("/")[0] for m in members}
        assert len(tops) == 1 and all(m.isreg() and ".." not in m.name.split("/") and not m.name.startswith("/")
                                      and m.name.count("/") == 1 for m in members)
        tar.extractall(tmp_path / "unpacked", filter="data")
    bundle = tmp_path / "unpacked" / tops.pop()
    names = {p.name for p in bundle.iterdir()}
    assert {"README.md", "repro.sh", "failure.json", "command.json", "model.hlo_module.pb", "compile_flags.json",
            "model.log"} <= names
    details = json.loads((bundle / "failure.json").read_text())
    assert (details["signature"], details["target"], details["lnc"]) == (group["signature"], "trn2", 2)
    command = _readme_command((bundle / "README.md").read_text())
    assert command.startswith("neuronx-cc compile ") and "--target trn2 --lnc 2 --output model.neff" in command

    env = cli.environ(NEFFSIM_FAIL_MATCH=FAULT)
    ran = subprocess.run(["sh", "-c", command], cwd=bundle, env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 1 and signature(ran.stdout + ran.stderr) == group["signature"]
    script = subprocess.run([str(bundle / "repro.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert script.returncode == 1 and signature(script.stderr) == group["signature"]
    fixed = subprocess.run(["sh", "-c", command], cwd=bundle, env=cli.environ(), capture_output=True, text=True)
    assert fixed.returncode == 0 and (bundle / "model.neff").stat().st_size > 0  # a well-formed command


def test_a_bundle_of_an_unknown_signature_is_a_one_line_error(cli: Cli, tmp_path: Path) -> None:  # noqa: F811
    store = tmp_path / "store"
    _warm(cli, store, "128", NEFFSIM_FAIL_MATCH=FAULT)
    for prefix, said in (("ffffffff", "no failure has a signature"), ("zz", "is not a signature")):
        proc = cli.run("failures", "bundle", prefix, "-o", str(tmp_path / "x.tar.gz"), "--store", str(store))
        last = proc.stderr.strip().splitlines()[-1]  # after the progress line, when stores were read
        assert proc.returncode == 2 and last.startswith("neffcache: ") and said in last
    bad = cli.run("failures", "bundle", "zz", "-o", str(tmp_path / "x.tar.gz"), "--store", str(store))
    assert len(bad.stderr.strip().splitlines()) == 1  # refused before any store is read
    assert not (tmp_path / "x.tar.gz").exists()
