"""One-line errors for bad store URLs, missing fsspec backends and busy leases.

Real subprocesses: what is checked is exactly what a user sees — one line on stderr, nothing
after it (no ``Exception ignored in ... __del__`` traceback at exit), the exit code of the table.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neffcache.coordination.lease import acquire
from neffcache.errors import readable_expiry
from neffcache.prune import PRUNE_LEASE
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a

CLI = [sys.executable, "-m", "neffcache.cli.main"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, check=False)


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.parametrize(("url", "code", "expected"), [
    ("gs://bucket/x", 2, "neffcache: configuration error: gs:// stores need the package gcsfs: pip install gcsfs"),
    ("az://container/x", 2, "neffcache: configuration error: az:// stores need the package adlfs: pip install adlfs"),
    ("foo://x", 2, "neffcache: bad store URL 'foo://x': unknown scheme foo://"),
    ("s3:/bad", 2, "neffcache: bad store URL 's3:/bad': did you mean s3://bad?"),
    ("fsx:/mnt/x", 2, "neffcache: bad store URL 'fsx:/mnt/x': did you mean fsx:///mnt/x?"),
    # A backend whose half-built object raises in __del__ (FTPFileSystem has no .ftp yet).
    ("ftp://127.0.0.1:9/x", 4, "neffcache: store unavailable: cannot open ftp://127.0.0.1:9/x"),
])
def test_bad_urls_and_missing_backends_are_one_line(url: str, code: int, expected: str) -> None:
    proc = run("scan", url)
    assert proc.returncode == code, proc.stdout + proc.stderr
    line = one_line(proc.stderr)
    assert line.startswith(expected), line
    clauses = [c.strip() for c in re.split(r"[():]", line) if len(c.strip()) > 12]
    assert len(clauses) == len(set(clauses)), line  # nothing said twice
    assert line.count("URL") <= 1, line
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_busy_lease_names_its_holder_and_a_readable_expiry(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cache")
    for i in range(3):
        publish_a(store, key=f"MODULE_{i}+abb26765")
    lease = acquire(store, PRUNE_LEASE, ttl=300)
    try:
        proc = run("prune", "--store", str(store.root), "--max-size", "11000", "--hit-grace", "0s", "--yes")
    finally:
        lease.release()
    assert proc.returncode == 6, proc.stdout + proc.stderr
    line = one_line(proc.stderr)
    assert re.search(r"held by \S+@\S+ pid \d+ until \d\d:\d\d:\d\d UTC \(in [45] min\)$", line), line


def test_readable_expiry() -> None:
    now = time.mktime((2025, 1, 2, 12, 30, 0, 0, 0, 0)) - time.timezone
    assert readable_expiry(now + 240, now) == "12:34:00 UTC (in 4 min)"
    assert readable_expiry(now + 20, now) == "12:30:20 UTC (in 20 s)"
    assert readable_expiry(now - 7200, now) == "10:30:00 UTC (2.0 h ago)"
    assert readable_expiry(now + 2 * 86400, now) == "2025-01-04 12:30:00 UTC (in 48.0 h)"
