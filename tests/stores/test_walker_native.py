"""The C walker (neffcache/stores/_listdir.c) under misuse: a callback that closes or steps the
walker it is called from gets a RuntimeError (it was a use-after-free: a segfault), and a walk
leaks no reference per directory. The misuse runs in a subprocess so a crash fails the test,
not the runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from neffcache.stores import local_listing
from tests.stores.c_helper import needs_native

REPO = Path(__file__).resolve().parents[2]
native = local_listing.native
pytestmark = needs_native

_CALLBACK = """
import os, sys
from neffcache.entry import FileInfo
from neffcache.stores import _listdir
root, action = sys.argv[1], sys.argv[2]
held = []

def skip(rel):
    walker = held[0]
    try:
        walker.close() if action == "close" else next(walker)
    except RuntimeError as exc:
        print("refused:", exc)
    return False

walker = _listdir.Walker(os.open(root, os.O_RDONLY | os.O_DIRECTORY), "", FileInfo, frozenset({b"sub"}), skip)
held.append(walker)
print(sorted(step[0] for step in walker))
walker.close()
"""


@pytest.mark.parametrize("action", ["close", "next"])
def test_a_callback_that_closes_or_steps_the_walker_is_refused(tmp_path: Path, action: str) -> None:
    for d in ("a/sub", "b/sub"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "f.bin").write_bytes(b"x")
    done = subprocess.run([sys.executable, "-c", _CALLBACK, str(tmp_path), action], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, f"rc {done.returncode} (a negative one is a signal): {done.stderr[-2000:]}"
    assert done.stdout.count("refused: Walker is") == 2
    assert done.stdout.strip().endswith("['a/sub', 'b/sub']")  # the walk itself went on unharmed


def test_a_walk_leaks_no_reference_per_directory(tmp_path: Path) -> None:
    from neffcache.entry import FileInfo

    for i in range(300):
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"d{i}" / "f.bin").write_bytes(b"x")
    assert native is not None

    def walk() -> int:
        return sum(1 for _ in native.Walker(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY), "", FileInfo))

    walk()  # warm up caches
    before = sys.getrefcount(())
    assert walk() == 300
    assert sys.getrefcount(()) - before < 10  # it was +1 per directory with files (300)


def test_the_depth_bound_is_the_same_in_c_and_python() -> None:
    assert native is not None and native.MAX_DEPTH == local_listing.MAX_DEPTH
