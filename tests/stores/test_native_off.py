"""The listing tests with ``NEFFCACHE_NATIVE=0``, in a pytest of their own: the pure-Python
listing is what a host without a compiler runs, so the tests around the C helper must pass there
too, with the ones about the C walker itself skipped for that reason (they used to fail and
error, blaming a build that had not failed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = ["tests/stores/test_listing_paths.py", "tests/stores/test_count_plain.py",
         "tests/stores/test_count_plain_top.py", "tests/stores/test_walker_native.py"]


def test_the_c_helper_tests_pass_or_skip_with_native_off(tmp_path: Path) -> None:
    code = ("import sys, pytest; from neffcache.stores import local_listing as m; "
            "assert m.native is None; sys.exit(pytest.main(sys.argv[1:]))")
    # The case that already reruns tests/hostile/ with NEFFCACHE_NATIVE=0 is left out: it is the
    # same run one level down.
    done = subprocess.run([sys.executable, "-c", code, "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "--basetemp", str(tmp_path / "inner"), "-k", "not hostile_listing_cases", *TESTS],
                          cwd=REPO, capture_output=True, text=True, timeout=280,
                          env={**os.environ, "NEFFCACHE_NATIVE": "0"})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout and "error" not in done.stdout, done.stdout
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips and all("NEFFCACHE_NATIVE=0 turns it off" in line for line in skips), "\n".join(skips)
