"""A store in which a FIFO replaces a file right before neffcache opens it (run as a script,
so a hang is a child that a timeout kills, never the test runner).

``python -m tests.hostile.fifo_swap verify|push ROOT NAME [S3-ENDPOINT]`` publishes three entries
(and pushes them to ``ROOT/dst``, or to a bucket at the endpoint), then swaps
the file ``NAME`` of the second for a FIFO at the last instant — after the listing saw it as a
regular file, before the open — and prints what verify or push made of each entry as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from neffcache.operations.verify import verify
from neffcache.replication.sync import sync
from neffcache.stores.local import LocalStore
from neffcache.stores.s3 import S3Store
from neffcache.testing.store_contract import publish_a

KEYS = [f"MODULE_{i}+abb26765" for i in range(3)]
BUCKET = "neffcache-test"  # tests/stores/conftest.py's


class SwappingStore(LocalStore):
    """Swaps ``target`` (a store path) for a FIFO the first time anything opens it by path."""

    target = ""

    def _swap(self, path: str) -> None:
        if path == self.target and not (self.root / path).is_fifo():
            (self.root / path).unlink()
            os.mkfifo(self.root / path)

    def _open_fd(self, path: str) -> int:
        self._swap(path)
        return super()._open_fd(path)

    def local_path(self, path: str) -> Path | None:
        got = super().local_path(path)  # checked as a regular file: the swap comes after
        self._swap(path)
        return got


def main(action: str, root: str, name: str, endpoint: str = "") -> None:
    store = SwappingStore(Path(root) / "src")
    paths = [publish_a(store, key=key)[0] for key in KEYS]
    SwappingStore.target = f"{paths[1]}/{name}"
    if action == "verify":
        report = verify(store, workers=1)
        out = {c.path: [str(c.status), *c.problems] for c in report.checks}
    else:
        dst = S3Store(f"s3://{BUCKET}/dst", endpoint_url=endpoint) if endpoint else LocalStore(Path(root) / "dst")
        got = sync(store, dst, parallel=1)
        out = {o.path: ["copied"] for o in got.copied} | {o.path: ["failed", o.reason] for o in got.failed}
    print(json.dumps({"paths": paths, "outcomes": out}))


if __name__ == "__main__":
    main(*sys.argv[1:])
