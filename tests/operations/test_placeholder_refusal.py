"""A `plan` placeholder NEFF never reaches a real store: publish, ingest, push and pull refuse it,
per entry, and nothing of it is committed (local stores and S3 on moto's server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from neffcache.entry import EntryState, Namespace
from neffcache.errors import PlaceholderNeff
from neffcache.index import NullIndex
from neffcache.layouts import get_layout
from neffcache.manifest import FileDigest, Manifest
from neffcache.operations.ingest import build_manifest, transfer
from neffcache.operations.publish import publish
from neffcache.placeholder import MAGIC, is_placeholder, placeholder_bytes, read_placeholder
from neffcache.replication.sync import pull, push
from neffcache.replication.tiers import Tiers
from neffcache.scan.report import load_entry, scan
from neffcache.stores import LocalStore
from neffcache.stores.base import Store
from neffcache.stores.s3 import S3Store
from neffcache.toolchain import Toolchain
from neffcache.warmers.placement import Placement
from tests.stores.conftest import BUCKET

TC = Toolchain("2.27.5334.0+f702b353", "trn2", 2)
HLO = b"HLO bytes of a graph " * 40
PLACEHOLDER = placeholder_bytes("c" * 64, len(HLO))
LAYOUTS = ("neuronxcc", "torchneuron")


def _key(layout: str, n: int = 1) -> str:
    return f"MODULE_{n}+d41d8cd9" if layout == "neuronxcc" else f"{n:02x}" * 16


def _files(ns: Namespace, key: str, neff: bytes) -> dict[str, bytes | Path]:
    names = get_layout(ns.layout).names(ns, key)
    assert names.hlo and names.neff
    files: dict[str, bytes | Path] = {names.hlo: HLO, names.neff: neff}
    if names.marker != names.neff:
        files[names.marker] = b""
    return files


def plant_runtime_entry(store: Store, layout: str, n: int = 1, neff: bytes = PLACEHOLDER) -> str:
    """An entry as a runtime pointed at the store would write it (no manifest), holding ``neff``:
    the files put one by one, marker last, bypassing every neffcache gate."""
    ns = get_layout(layout).namespace_for(TC)
    key = _key(layout, n)
    plan = get_layout(layout).plan_entry(ns, key)
    files = _files(ns, key, neff)
    for name in sorted(files, key=lambda name: name == plan.marker_name):
        store.put_file(f"{plan.base}/{name}", files[name])  # type: ignore[arg-type]
    return plan.path


def test_the_placeholder_value() -> None:
    assert is_placeholder(PLACEHOLDER) and PLACEHOLDER.startswith(MAGIC)
    header = read_placeholder(PLACEHOLDER)
    assert header is not None and (header["hlo_sha256"], header["hlo_size"]) == ("c" * 64, len(HLO))
    assert "never to be served" in header["note"]
    assert not is_placeholder(b"NEFFSIM1\n{}") and read_placeholder(b"NEFFSIM1\n") is None
    assert read_placeholder(MAGIC + b"{not json\n") is None and read_placeholder(MAGIC + b"[1]\n") is None


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("as_file", [False, True], ids=["bytes", "file"])
def test_publish_refuses_a_placeholder_and_writes_nothing(tmp_path: Path, layout: str, as_file: bool) -> None:
    store = LocalStore(tmp_path / "store")
    ns = get_layout(layout).namespace_for(TC)
    key = _key(layout)
    files = _files(ns, key, PLACEHOLDER)
    if as_file:
        neff_name = get_layout(layout).names(ns, key).neff
        assert neff_name
        (tmp_path / "staged.neff").write_bytes(PLACEHOLDER)
        files[neff_name] = tmp_path / "staged.neff"
    digests = {n: FileDigest("0" * 64, 1) for n in files}
    manifest = Manifest(layout=layout, key=key, files=digests, toolchain=TC)  # a forged one: publish must look
    with pytest.raises(PlaceholderNeff, match="placeholder written by `neffcache plan`"):
        publish(store, ns, key, files, manifest)
    assert list(store.iter_files()) == []


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ingest_refuses_to_vouch_for_a_placeholder(tmp_path: Path, layout: str) -> None:
    ns = get_layout(layout).namespace_for(TC)
    with pytest.raises(PlaceholderNeff) as caught:
        build_manifest(layout, _key(layout), _files(ns, _key(layout), PLACEHOLDER), toolchain=TC)
    assert caught.value.names == [get_layout(layout).names(ns, _key(layout)).neff]

    # The warmers' ingest: a runtime left a placeholder entry in the work store (pointed at it
    # with the recorder on PATH): it gets no manifest and goes nowhere; a real entry beside it does.
    work, shared = LocalStore(tmp_path / "work"), LocalStore(tmp_path / "shared")
    bad = plant_runtime_entry(work, layout, 1)
    good = plant_runtime_entry(work, layout, 2, neff=b"a real NEFF" * 100)
    placement = Placement(Tiers([work, shared]), NullIndex())
    got = placement.ingest_many([(bad, {}, None), (good, {}, None)], toolchain=TC)
    assert list(got) == [good]
    entry = load_entry(work, bad)
    assert entry is not None and not entry.has_manifest
    assert [e.path for e in scan(shared).entries] == [good]


def _assert_refused(report_failed: tuple[object, ...], path: str) -> None:
    reasons = {o.path: o.reason for o in report_failed}  # type: ignore[attr-defined]
    assert path in reasons and "placeholder written by `neffcache plan`" in reasons[path], reasons


@pytest.mark.parametrize("layout", LAYOUTS)
def test_push_and_pull_between_local_stores_refuse_it(tmp_path: Path, layout: str) -> None:
    src, dst = LocalStore(tmp_path / "src"), LocalStore(tmp_path / "dst")
    bad = plant_runtime_entry(src, layout, 1)
    good = plant_runtime_entry(src, layout, 2, neff=b"a real NEFF" * 100)
    for sync in (push, pull):
        report = sync(src, dst)
        assert not report.ok and [o.path for o in report.copied] in ([good], [])
        _assert_refused(report.failed, bad)
    assert [e.path for e in scan(dst).entries] == [good]
    with pytest.raises(PlaceholderNeff):
        entry = load_entry(src, bad)
        assert entry is not None and entry.state is EntryState.SUCCESS
        transfer(src, entry, dst)
    assert load_entry(dst, bad) is None


def test_the_cli_push_says_so_and_exits_1(tmp_path: Path) -> None:
    src = LocalStore(tmp_path / "src")
    bad = plant_runtime_entry(src, "neuronxcc")
    proc = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "push", str(tmp_path / "src"),
                           str(tmp_path / "dst")], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert bad in proc.stdout + proc.stderr and "placeholder" in proc.stdout + proc.stderr
    assert scan(LocalStore(tmp_path / "dst")).entries == ()


def _objects(endpoint: str, prefix: str) -> list[str]:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    return sorted(o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
                  for o in page.get("Contents", ()))


@pytest.mark.s3
@pytest.mark.parametrize("layout", LAYOUTS)
def test_push_to_s3_and_pull_from_s3_refuse_it(tmp_path: Path, request: pytest.FixtureRequest, layout: str) -> None:
    endpoint: str = request.getfixturevalue("s3_endpoint")
    local = LocalStore(tmp_path / "local")
    bad = plant_runtime_entry(local, layout, 1)
    good = plant_runtime_entry(local, layout, 2, neff=b"a real NEFF" * 100)
    remote = S3Store(f"s3://{BUCKET}/cache", endpoint_url=endpoint)
    try:
        report = push(local, remote)
        _assert_refused(report.failed, bad)
        assert [o.path for o in report.copied] == [good]
        assert not [k for k in _objects(endpoint, "cache/") if k.startswith(f"cache/{bad}")]

        # A bucket someone filled by hand (or a runtime with the recorder on PATH): pull refuses it.
        plant_runtime_entry(remote, layout, 3)
        fresh = LocalStore(tmp_path / "fresh")
        pulled = pull(remote, fresh)
        _assert_refused(pulled.failed, get_layout(layout).plan_entry(get_layout(layout).namespace_for(TC),
                                                                     _key(layout, 3)).path)
        assert [e.path for e in scan(fresh).entries] == [good]
    finally:
        remote.close()


# moto's server, defined once in the stores' suite.
from tests.stores.conftest import aws_env, moto_server, s3_endpoint  # noqa: E402, F401
