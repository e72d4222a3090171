"""Hostile trees for the fault probes: good entries among crafted ones, and the CLI as a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from neffcache.manifest import MANIFEST_NAME
from neffcache.stores.base import Store
from neffcache.testing.store_contract import publish_a

# name -> how its manifest is spoiled (None: a good entry)
CRAFTED: dict[str, bytes | None] = {
    "MODULE_1+abb26765": None,
    "MODULE_2+abb26765": None,
    "MODULE_3+abb26765": None,
    "MODULE_4+abb26765": b"huge-size",  # "size": 1e400
    "MODULE_5+abb26765": b"deep",  # [[[[... 100k levels
    "MODULE_6+abb26765": b"omits-neff",  # no model.neff in "files"
    "MODULE_7+abb26765": b"nan",  # "created": NaN
    "MODULE_8+abb26765": b"not-a-dict",
}
GOOD = sorted(k for k, v in CRAFTED.items() if v is None)
BAD = sorted(k for k, v in CRAFTED.items() if v is not None)
BAD_NAME_ENTRY = "MODULE_1+abb26765"  # a good entry holding a file with a bad name


def spoil(raw: bytes, how: bytes) -> bytes:
    data = json.loads(raw)
    if how == b"huge-size":
        return json.dumps(data).replace('"size": ', '"size": 1e400, "x": ', 1).encode()
    if how == b"deep":
        return b"[" * 100_000 + b"]" * 100_000
    if how == b"omits-neff":
        del data["files"]["model.neff"]
        return json.dumps(data).encode()
    if how == b"nan":
        data["created"] = float("nan")
        return json.dumps(data).encode()  # Python writes NaN
    return b"[1, 2, 3]"


def build_tree(store: Store) -> dict[str, str]:
    """Publish every entry of CRAFTED into ``store``, then spoil the bad ones' manifests and
    plant badly named files. Returns key -> entry path."""
    paths = {key: publish_a(store, key=key)[0] for key in CRAFTED}
    for key, how in CRAFTED.items():
        if how is not None:
            manifest = f"{paths[key]}/{MANIFEST_NAME}"
            store.put_file(manifest, spoil(store.read_bytes(manifest), how))
    return paths


def plant_bad_names(root: Path, paths: dict[str, str]) -> list[str]:
    """Files a local directory may hold but no store path may have. Returns their paths."""
    planted = [f"{paths[BAD_NAME_ENTRY]}/notes (1).txt", "notes (1).txt", "tab\there.txt"]
    for rel in planted:
        (root / rel).write_bytes(b"not ours")
    return planted


def neffcache(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "neffcache.cli.main", *args], capture_output=True, text=True,
                          timeout=180, env={**os.environ, **(env or {})})


def json_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(result.stdout)
    except ValueError:
        detail = f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        raise AssertionError(f"not JSON (rc {result.returncode}): {detail}") from None
    return data


def chattr_works(probe: Path) -> bool:
    probe.write_bytes(b"")
    try:
        done = subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode == 0
    except FileNotFoundError:
        return False
    if done:
        subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
    probe.unlink()
    return done and os.geteuid() == 0


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """Make ``path`` undeletable for real (root ignores file modes; the immutable flag it does not)."""
    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
