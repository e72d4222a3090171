"""`neffcache demo --workdir DIR` never deletes what it did not make: a directory holding the
user's files is refused before anything changes, and a rerun replaces only the demo's own parts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from neffcache.cli.demo import MARKER, PARTS, claim_workdir
from neffcache.errors import ConfigError


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_workdir_holding_the_users_files_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    work = tmp_path / "project"
    (work / "bin").mkdir(parents=True)
    (work / "logs").mkdir()
    (work / "bin" / "my-tool").write_text("#!/bin/sh\necho mine\n")
    (work / "logs" / "app.log").write_text("a line the user needs\n")
    before = _tree(work)
    proc = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "demo", "--workdir", str(work)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "holds files the demo did not make (bin, logs)" in proc.stderr
    assert "nothing was changed" in proc.stderr and "Traceback" not in proc.stderr
    assert _tree(work) == before
    assert not (work / MARKER).exists()


def test_a_new_or_empty_directory_is_marked_before_anything_is_made(tmp_path: Path) -> None:
    for work in (tmp_path / "new" / "demo", tmp_path / "empty"):
        if work.name == "empty":
            work.mkdir()
        assert claim_workdir(work) == work
        assert [p.name for p in work.iterdir()] == [MARKER]
        assert all(part in (work / MARKER).read_text().splitlines() for part in PARTS)


def test_a_rerun_replaces_the_demos_parts_and_keeps_everything_else(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    claim_workdir(work)
    for part in ("cache", "logs", "bin"):
        (work / part).mkdir()
        (work / part / "made-by-the-demo").write_text("x")
    (work / "server.log").write_text("old server log")
    (work / "notes.txt").write_text("the user's note beside the demo's parts")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep").write_text("not the demo's")
    (work / "spool").symlink_to(outside, target_is_directory=True)
    claim_workdir(work)
    assert sorted(p.name for p in work.iterdir()) == sorted([MARKER, "notes.txt"])
    assert (outside / "keep").read_text() == "not the demo's"


def test_a_file_as_workdir_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        claim_workdir(tmp_path / "f")
