"""Files a runtime keeps inside an entry travel with it: NxD's ``wrapped_neff.hlo`` (issue 35).

NxD writes it beside ``model.neff`` as the second result of its compile: a copy of the entry
without it is incomplete. push and pull carry it, the manifest covers it (so every pull checks
its digest), and a manifest written before neffcache knew it (minor revision 1) is completed
with the digest of the bytes sent, not turned CORRUPT.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from neffcache.entry import EntryState
from neffcache.manifest import MANIFEST_NAME, Manifest
from neffcache.operations.verify import CheckStatus, verify
from neffcache.replication.sync import pull, push
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from neffcache.stores.s3 import S3Store
from tests.runtime_caches import write_neuronxcc_entry, write_nxd_wrapped_neff
from tests.stores.conftest import aws_env, moto_server, s3_endpoint, s3_store  # noqa: F401 - fixtures

WRAPPED = "wrapped_neff.hlo"


def _nxd_root(root: Path, n: int = 3) -> list[Path]:
    entries = [write_neuronxcc_entry(root, f"nxd-{i}".encode()) for i in range(n)]
    for entry in entries:
        write_nxd_wrapped_neff(entry)
    return entries


def test_push_and_pull_carry_wrapped_neff_and_verify_its_digest(tmp_path: Path, s3_store: S3Store) -> None:  # noqa: F811
    root = tmp_path / "runtime"
    entries = _nxd_root(root)
    pushed = push(LocalStore(root), s3_store)
    assert len(pushed.copied) == 3 and not pushed.failed
    remote = {e.key: e for e in scan(s3_store, read_manifests=True).entries}
    for entry in entries:
        got = remote[entry.name]
        assert got.state is EntryState.SUCCESS and WRAPPED in got.files
        assert got.manifest is not None and WRAPPED in got.manifest.files
        assert s3_store.read_bytes(got.store_path(WRAPPED)) == (entry / WRAPPED).read_bytes()
    back = LocalStore(tmp_path / "pulled")
    pulled = pull(s3_store, back)
    assert len(pulled.copied) == 3 and not pulled.failed
    for entry in entries:
        rel = entry.relative_to(root)
        assert (tmp_path / "pulled" / rel / WRAPPED).read_bytes() == (entry / WRAPPED).read_bytes()
    # The manifest vouches for it: a flipped byte is found by verify (it was never checked before).
    target = tmp_path / "pulled" / entries[0].relative_to(root) / WRAPPED
    target.write_bytes(b"X" + target.read_bytes()[1:])
    bad = [c for c in verify(back).checks if c.status is CheckStatus.CORRUPT]
    assert [c.path for c in bad] == [entries[0].relative_to(root).as_posix()]


def test_a_manifest_from_before_wrapped_neff_is_completed_not_corrupt(tmp_path: Path) -> None:
    """A store neffcache filled when it called wrapped_neff.hlo another tool's file: its
    manifests (minor 1) lack it. The entry stays SUCCESS; a push copies the file and its
    manifest at the destination covers it, with the digest of the bytes sent."""
    root = tmp_path / "old"
    (entry,) = _nxd_root(root, 1)
    push(LocalStore(root), LocalStore(tmp_path / "published"))  # a manifest that covers it
    published = tmp_path / "published" / entry.relative_to(root)
    data = json.loads((published / MANIFEST_NAME).read_text())
    assert WRAPPED in data["files"] and data["minor"] >= 2
    del data["files"][WRAPPED]
    data["minor"] = 1
    (published / MANIFEST_NAME).write_text(json.dumps(data))
    old = LocalStore(tmp_path / "published")
    (found,) = scan(old, read_manifests=True).entries
    assert found.state is EntryState.SUCCESS and not found.problems
    assert [c.status for c in verify(old).checks] == [CheckStatus.OK]
    dst = LocalStore(tmp_path / "dst")
    assert len(push(old, dst).copied) == 1
    (copied,) = scan(dst, read_manifests=True).entries
    assert copied.manifest is not None and WRAPPED in copied.manifest.files
    assert (tmp_path / "dst" / entry.relative_to(root) / WRAPPED).read_bytes() == (entry / WRAPPED).read_bytes()


def test_a_new_manifest_that_leaves_wrapped_neff_out_vouches_for_too_little(tmp_path: Path) -> None:
    root = tmp_path / "s"
    (entry,) = _nxd_root(root, 1)
    push(LocalStore(root), LocalStore(tmp_path / "p"))
    published = tmp_path / "p" / entry.relative_to(root)
    manifest = Manifest.from_bytes((published / MANIFEST_NAME).read_bytes())
    stripped = dataclasses.replace(manifest, files={n: d for n, d in manifest.files.items() if n != WRAPPED})
    (published / MANIFEST_NAME).write_bytes(stripped.to_bytes())
    (found,) = scan(LocalStore(tmp_path / "p"), read_manifests=True).entries
    assert found.state is EntryState.CORRUPT
    assert any(f"{WRAPPED} is not covered by the manifest" in p for p in found.problems)
