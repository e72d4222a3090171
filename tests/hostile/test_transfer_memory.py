"""Peak RSS of push, pull and verify does not grow with the file size or ``--parallel``.

A 512 MiB sparse NEFF (2 GiB is measured by bench/memory_bench.py and recorded in
docs/performance.md: moto keeps objects in memory, and 2 GiB would make this test heavy).
Each command is a real ``neffcache`` process; its own peak RSS is its VmHWM at exit (wait4's
``ru_maxrss`` would not do: a child spawned by a big process inherits that process's peak, and
this one holds moto). Before
the byte budget, this push held ``--parallel`` x 8 MiB parts at once: ~650 MB at 64.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bench.common import neffcache_measured
from bench.memory_bench import make_entry
from neffcache.manifest import sha256_file
from tests.stores.conftest import BUCKET, aws_env, moto_server, s3_endpoint  # noqa: F401 - fixtures

pytestmark = [pytest.mark.s3, pytest.mark.slow]

SIZE = 512 << 20
CEILING_MB = 200


def sparse_entry(root: Path) -> str:
    """A layout-A entry with a sparse ``model.neff`` of SIZE bytes (the benchmark's own builder)."""
    return make_entry(root, SIZE)


def run_measured(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> float:
    """Run one neffcache command; its own peak RSS (VmHWM) in MB."""
    hwm = tmp_path / "vmhwm"
    hwm.unlink(missing_ok=True)
    proc = subprocess.run(neffcache_measured(hwm, list(args)), capture_output=True, text=True,
                          timeout=240, check=False, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(hwm.read_text()) / 1024


def test_push_and_pull_of_a_big_neff_stay_under_the_ceiling(s3_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    src = tmp_path / "src"
    entry = sparse_entry(src)
    remote = f"s3://{BUCKET}/mem"
    common = ["--endpoint-url", s3_endpoint, "--parallel", "64"]
    pushed = run_measured(tmp_path, "push", str(src), remote, *common)
    assert pushed < CEILING_MB, f"push peak RSS {pushed:.0f} MB"
    dst = tmp_path / "dst"
    pulled = run_measured(tmp_path, "pull", remote, str(dst), *common)
    assert pulled < CEILING_MB, f"pull peak RSS {pulled:.0f} MB"
    assert sha256_file(dst / entry / "model.neff") == sha256_file(src / entry / "model.neff")
    assert (dst / entry / "model.done").exists()
    verified_local = run_measured(tmp_path, "verify", str(dst))
    assert verified_local < CEILING_MB, f"verify (local) peak RSS {verified_local:.0f} MB"
    verified_s3 = run_measured(tmp_path, "verify", remote, env={"AWS_ENDPOINT_URL": s3_endpoint})
    assert verified_s3 < CEILING_MB, f"verify (S3) peak RSS {verified_s3:.0f} MB"
    # A runtime-written entry (no manifest): published with one computed from the bytes read.
    (src / entry / "neffcache.json").unlink()
    published = run_measured(tmp_path, "push", str(src), f"s3://{BUCKET}/runtime", *common)
    assert published < CEILING_MB, f"publish of a runtime entry: peak RSS {published:.0f} MB"
    print(f"publish of a runtime-written entry {published:.0f} MB")
    print(f"peak RSS at --parallel 64, {SIZE >> 20} MiB NEFF: push {pushed:.0f} MB, pull {pulled:.0f} MB, "
          f"verify {verified_local:.0f} MB (local) {verified_s3:.0f} MB (S3)")
