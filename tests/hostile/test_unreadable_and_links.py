"""An unreadable entry directory is one CORRUPT entry, not the end of the scan; an entry made of
links to blobs inside the root (the Hugging Face hub's layout) is read through them."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neffcache.entry import EntryState
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a


def _cli_without_dac(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "tests.hostile.nodac", *args], capture_output=True, text=True,
                          timeout=120)
    if done.returncode == 99:
        pytest.skip("cannot drop CAP_DAC_OVERRIDE here (capset refused)")
    assert "Traceback" not in done.stderr, done.stderr
    return done



def test_an_unreadable_entry_directory_is_one_corrupt_entry(tmp_path: Path) -> None:
    src = LocalStore(tmp_path / "src")
    paths = [publish_a(src, key=f"MODULE_{i}+abb26765")[0] for i in range(4)]
    locked_out = src.root / paths[0]
    locked_out.chmod(0)
    try:
        scanned = _cli_without_dac("scan", str(src.root), "--json")
        assert scanned.returncode == 1, scanned.stdout + scanned.stderr  # one CORRUPT entry
        report = json.loads(scanned.stdout)
        assert report["entries"] == 4 and report["states"]["SUCCESS"] == 3 and report["states"]["CORRUPT"] == 1
        assert any(paths[0] in w and "unreadable directory" in w for w in report["warnings"])

        verified = _cli_without_dac("verify", str(src.root))
        assert verified.returncode == 5, verified.stdout + verified.stderr

        out = tmp_path / "out"
        pushed = _cli_without_dac("push", str(src.root), str(out), "--json")
        assert pushed.returncode in (0, 1), pushed.stdout + pushed.stderr
        assert json.loads(pushed.stdout)["copied"] == 3
    finally:
        locked_out.chmod(0o755)


def _hub_entry(root: Path) -> tuple[str, dict[str, bytes]]:
    """An entry whose files are relative links to ``blobs/<sha256>`` (huggingface_hub's cache)."""
    staging = LocalStore(root.parent / "staging")
    path, _ = publish_a(staging, key="MODULE_5+abb26765")
    files = {p.name: p.read_bytes() for p in (staging.root / path).iterdir()}
    (root / "blobs").mkdir(parents=True)
    entry = root / path
    entry.mkdir(parents=True)
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (entry / name).symlink_to(os.path.relpath(blob, entry))
    return path, files


def test_an_entry_of_in_root_links_is_served(tmp_path: Path) -> None:
    root = tmp_path / "hub"
    path, files = _hub_entry(root)
    store = LocalStore(root)
    entry = scan(store, read_manifests=True).find(path)
    assert entry is not None and entry.state is EntryState.SUCCESS, entry
    assert entry.files["model.neff"].size == len(files["model.neff"])
    assert store.read_bytes(f"{path}/model.neff") == files["model.neff"]
    assert store.local_path(f"{path}/model.neff") == root / "blobs" / hashlib.sha256(files["model.neff"]).hexdigest()

    out = tmp_path / "out"
    pushed = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "push", str(root), str(out), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert json.loads(pushed.stdout)["copied"] == 1
    for name, data in files.items():
        copied = out / path / name
        assert not copied.is_symlink() and copied.read_bytes() == data
