"""A plain path on a network mount gets the shared-mount rules, as if it were fsx://."""

from __future__ import annotations

from pathlib import Path

import pytest

from neffcache.stores import mounts, open_store
from neffcache.stores.local import LocalStore

LOCAL = "23 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw\n"


def mountinfo(tmp_path: Path, *extra: str) -> Path:
    path = tmp_path / "mountinfo"
    path.write_text(LOCAL + "".join(extra))
    return path


def test_parse_mountinfo_unescapes_and_skips_junk() -> None:
    text = (LOCAL
            + "98 23 0:52 / /mnt/fsx\\040cache rw,relatime shared:40 - lustre 172.31.0.5@tcp:/abc rw,flock\n"
            + "garbage line\n"
            + "99 23 0:53 / /mnt/efs rw - nfs4 fs-123.efs.us-west-2.amazonaws.com:/ rw\n")
    assert mounts.parse_mountinfo(text) == [("/", "ext4"), ("/mnt/fsx cache", "lustre"), ("/mnt/efs", "nfs4")]


def test_longest_and_last_mount_wins(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    info = mountinfo(tmp_path, f"50 23 0:40 / {tmp_path} rw - nfs4 server:/export rw\n",
                     f"51 50 0:41 / {root} rw - ext4 /dev/nvme1n1 rw\n")
    assert mounts.filesystem_type(root / "not" / "there", info) == "ext4"  # the nearest existing parent
    assert mounts.filesystem_type(tmp_path / "other", info) == "nfs4"
    over = mountinfo(tmp_path, f"50 23 0:40 / {tmp_path} rw - ext4 /dev/sdb rw\n",
                     f"52 23 0:42 / {tmp_path} rw - lustre fsx@tcp:/x rw\n")
    assert mounts.filesystem_type(tmp_path, over) == "lustre"  # mounted over the first one


@pytest.mark.parametrize(("fstype", "network"), [
    ("nfs4", True), ("lustre", True), ("fuse.mountpoint-s3", True), ("ext4", False), ("xfs", False),
    ("overlay", False), ("tmpfs", False), (None, False),
])
def test_network_filesystems(fstype: str | None, network: bool) -> None:
    assert mounts.is_network_filesystem(fstype) is network


def test_open_store_switches_a_plain_path_on_nfs_to_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mounts, "MOUNTINFO", mountinfo(tmp_path, f"50 23 0:40 / {tmp_path} rw - nfs4 srv:/e rw\n"))
    plain = open_store(str(tmp_path / "cache"))
    assert isinstance(plain, LocalStore) and plain.shared and plain.url.startswith("fsx://")
    as_file = open_store(f"file://{tmp_path}/cache")
    assert isinstance(as_file, LocalStore) and as_file.shared and as_file.url.startswith("file://")
    forced = open_store(str(tmp_path / "cache"), shared=False)  # an explicit choice is kept
    assert isinstance(forced, LocalStore) and not forced.shared


def test_local_disk_and_unreadable_mountinfo_stay_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mounts, "MOUNTINFO", mountinfo(tmp_path))
    store = open_store(str(tmp_path / "cache"))
    assert isinstance(store, LocalStore) and not store.shared and store.url.startswith("file://")
    monkeypatch.setattr(mounts, "MOUNTINFO", tmp_path / "missing")
    assert mounts.filesystem_type(tmp_path) is None
    assert not open_store(str(tmp_path / "cache2")).shared  # type: ignore[attr-defined]
