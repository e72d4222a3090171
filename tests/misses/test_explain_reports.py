"""Reports read back for why-miss: plan's and run's shapes, only the misses, and hostile files refused
with one line naming the file and the field."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from neffcache.errors import ConfigError
from neffcache.misses.inputs import MAX_REPORT_BYTES, Known, missed_from_argument, missed_from_report

NS = "trn2-lnc2/neuronxcc-2.21.33363.0+82129205"
TC = {"compiler_version": "2.21.33363.0+82129205", "target": "trn2", "lnc": 2}


def graph(n: int, status: str | None = "miss", **extra: Any) -> dict[str, Any]:
    out = {"path": f"{NS}/MODULE_{n}+e30acd3a", "layout": "neuronxcc", "namespace": NS, "key": f"MODULE_{n}+e30acd3a",
           "toolchain": TC, "hlo_sha256": f"{n:064x}", "hlo_size": 100 + n, "flags": ["--lnc=2"], "bucket": "SEQ=128",
           "tags": {"model": "llama"}, **extra}
    if status is not None:
        out["status"] = status
    return out


def write(tmp_path: Path, data: object, name: str = "report.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_a_plan_report_gives_its_misses_and_skips_its_hits(tmp_path: Path) -> None:
    # plan --json: each graph is a WantedGraph with where it is held (neffcache/misses/lookup.py).
    held = {"store": None, "index_stores": ["s3://other-region/cache"]}
    report = {"command": "plan", "graphs": [graph(1, "hit", store="file:///nvme"), graph(2, "miss", **held),
                                            graph(3, "elsewhere", **held)], "totals": {"graphs": 3}}
    missed = missed_from_report(write(tmp_path, report))
    assert [m.parts.key for m in missed] == ["MODULE_2+e30acd3a", "MODULE_3+e30acd3a"]
    first = missed[0]
    assert (first.path, first.status, first.parts.target, first.parts.lnc, first.parts.hlo_size) == \
        (f"{NS}/MODULE_2+e30acd3a", "miss", "trn2", 2, 102)
    assert first.parts.tags == {"model": "llama", "bucket": "SEQ=128"} and first.parts.flags == ("--lnc=2",)


def test_a_bare_list_of_graphs_is_read_and_graphs_without_status_are_misses(tmp_path: Path) -> None:
    missed = missed_from_report(write(tmp_path, [graph(1, None), graph(2, "compiled"), graph(3, "failed")]))
    assert [m.status for m in missed] == [None, "compiled", "failed"]


@pytest.mark.parametrize(("content", "says"), [
    (b"{not json", "is not JSON"),
    (b'{"graphs": [{"hlo_size": NaN}]}', "is not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "is not JSON"),
    (b'{"graphs": 7}', "no list of graphs"),
    (b'"just a string"', "no list of graphs"),
    (b"\xff\xfe not utf-8", "is not JSON"),
])
def test_a_file_that_is_not_a_report_is_one_line(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=says) as caught:
        missed_from_report(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


@pytest.mark.parametrize(("field", "value", "says"), [
    ("path", "../../../etc/passwd", "graph 2: 'path'|'..'"),
    ("path", "/etc/passwd", "absolute"),
    ("key", "K" * 100_000, "'key' must be a string of at most"),
    ("flags", ["--x"] * 100_000, "'flags' must be a list"),
    ("hlo_size", 1e300, "hlo_size"),
    ("hlo_sha256", "../x", "hlo_sha256"),
    ("toolchain", {"compiler_version": "2.21/../../x", "target": "trn2", "lnc": 2}, "invalid compiler version"),
    ("status", "m" * 1000, "'status' must be a short string"),
    ("tags", {"model": ["x"]}, "tags"),
])
def test_a_hostile_graph_refuses_the_whole_report_naming_the_graph(tmp_path: Path, field: str, value: object,
                                                                   says: str) -> None:
    bad = {**graph(2), field: value}
    with pytest.raises(ConfigError, match=says) as caught:
        missed_from_report(write(tmp_path, {"graphs": [graph(1), bad]}))
    message = str(caught.value)
    assert "\n" not in message and len(message) < 600 and "graph 2" in message


def test_a_report_that_is_not_a_regular_file_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        missed_from_report(fifo)
    with pytest.raises(ConfigError, match="No such file"):
        missed_from_report(tmp_path / "absent.json")


def test_an_oversized_report_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(MAX_REPORT_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(ConfigError, match=r"above the .* byte limit"):
        missed_from_report(big)


def test_a_symlinked_report_is_read_as_its_target(tmp_path: Path) -> None:
    real = write(tmp_path, [graph(5)])
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert [m.parts.key for m in missed_from_report(link)] == ["MODULE_5+e30acd3a"]


@pytest.mark.parametrize(("value", "says"), [
    ("trn2-lnc2/../../etc/passwd", "'..' is not allowed"),
    ("MODULE 1", "neither a file, a key nor an entry path"),
    ("somewhere/else", "not an entry path of any layout"),
])
def test_a_bad_argument_is_one_line(value: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        missed_from_argument(value, Known())


def test_the_three_argument_forms(tmp_path: Path) -> None:
    by_key = missed_from_argument("MODULE_77+e30acd3a", Known(compiler_version=TC["compiler_version"],
                                                              target="trn2", lnc=2))
    assert by_key.path == f"{NS}/MODULE_77+e30acd3a"  # the toolchain places it
    assert missed_from_argument("MODULE_77+e30acd3a", Known()).path is None
    by_path = missed_from_argument(f"{NS}/MODULE_77+e30acd3a", Known())
    assert (by_path.parts.compiler_version, by_path.parts.target, by_path.parts.lnc) == (TC["compiler_version"],
                                                                                        "trn2", 2)
    native = missed_from_argument("ab" * 16, Known())
    assert native.parts.layout == "torchneuron"
    # An HLO in a compile work directory: its file name names the entry, the flags file is beside it.
    work = tmp_path / "neuroncc_compile_workdir" / "1234"
    work.mkdir(parents=True)
    hlo = work / "model.MODULE_77+e30acd3a.hlo_module.pb"
    hlo.write_bytes(b"HloModule m")
    (work / "compile_flags.json").write_text('["--target=trn1", "--model-type=transformer"]')
    from_file = missed_from_argument(str(hlo), Known(compiler_version=TC["compiler_version"]))
    assert (from_file.parts.key, from_file.parts.target, from_file.parts.flags, from_file.parts.hlo_size) == \
        ("MODULE_77+e30acd3a", "trn1", ("--model-type=transformer",), 11)


def test_a_corrupt_flags_file_beside_an_hlo_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "model.hlo_module.pb").write_bytes(b"HloModule m")
    (tmp_path / "compile_flags.json").write_bytes(b'{"not": "a list"}')
    with pytest.raises(ConfigError, match=r"flags file .*compile_flags\.json"):
        missed_from_argument(str(tmp_path / "model.hlo_module.pb"), Known())
