"""Report files are written whole or not at all (why-miss --from-report reads them back)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from neffcache.cli.output import write_report


def test_a_report_replaces_the_previous_one_whole(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    write_report(path, {"run": 1})
    write_report(path, {"run": 2, "misses": ["a b"]})
    assert json.loads(path.read_text()) == {"run": 2, "misses": ["a b"]}
    assert _left(tmp_path) == ["report.json"], "a temp file was left behind"


def test_a_failed_write_keeps_the_previous_report_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "report.json"
    write_report(path, {"run": 1})

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_report(path, {"run": 2})
    assert json.loads(path.read_text()) == {"run": 1}
    assert _left(tmp_path) == ["report.json"]


def _left(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(("report", ".report")))
