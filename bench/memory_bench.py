"""Peak RSS of ``neffcache push`` and ``pull`` of one big NEFF to S3 (moto), by ``--parallel``.

    .venv/bin/python -m bench.memory_bench --size-mib 2048 --parallel 16,64

One layout-A entry (manifest included) whose ``model.neff`` is a sparse file of ``--size-mib``
MiB is pushed to a moto server (its own process on 127.0.0.1, as in s3_bench) and pulled back
into an empty local store, once per ``--parallel``. Each command runs as its own process; its
peak RSS is the child's ``ru_maxrss`` from ``wait4`` (that process alone, not the moto server).
The NEFF is sparse so the bench needs no disk for the source; moto keeps the object in memory
(about twice its size while it assembles the parts), so 2 GiB needs ~5 GB free.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.s3_bench import BIN, BUCKET, MotoProcess
from neffcache.layouts import get_layout
from neffcache.operations.ingest import build_manifest
from neffcache.toolchain import Toolchain

TC = Toolchain("2.27.5334.0+f702b353", "trn2", 2)
KEY = "MODULE_4242+d41d8cd9"


def make_entry(root: Path, size: int) -> str:
    """A layout-A entry with a sparse ``model.neff`` of ``size`` bytes and its manifest."""
    layout = get_layout("neuronxcc")
    plan = layout.plan_entry(layout.namespace_for(TC), KEY)
    entry = root / plan.base
    entry.mkdir(parents=True)
    (entry / "model.hlo_module.pb").write_bytes(b"HLO " + KEY.encode())
    (entry / "compile_flags.json").write_bytes(b"[]")
    with open(entry / "model.neff", "wb") as f:
        f.write(b"NEFF")
        f.truncate(size)
    files = {n: entry / n for n in ("model.hlo_module.pb", "compile_flags.json", "model.neff")}
    files["model.done"] = entry / "model.done"
    (entry / "model.done").touch()
    manifest = build_manifest("neuronxcc", KEY, files, toolchain=TC)
    (entry / "neffcache.json").write_bytes(manifest.to_bytes())
    return plan.path


def peak_rss(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(seconds, peak RSS in MB of that process alone, stdout)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read().decode()
    err = proc.stderr.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed ({proc.returncode}): {err[-2000:]}")
    return seconds, usage.ru_maxrss / 1024, out  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--parallel", default="16,64", help="Comma-separated --parallel values.")
    parser.add_argument("--dir", type=Path, default=None, help="Scratch directory (default: a temp dir).")
    args = parser.parse_args()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")})
    base = Path(tempfile.mkdtemp(prefix="membench-", dir=args.dir))
    moto = MotoProcess()
    try:
        src = base / "src"
        make_entry(src, args.size_mib << 20)
        print(f"one entry, model.neff {args.size_mib} MiB (sparse); moto_server at {moto.url}")
        print(f"{'parallel':>8} {'push s':>8} {'push MB':>8} {'pull s':>8} {'pull MB':>8}")
        for parallel in (int(p) for p in args.parallel.split(",")):
            moto.fresh_bucket()
            dst = base / f"pull-{parallel}"
            remote = f"s3://{BUCKET}/mem"
            common = ["--endpoint-url", moto.url, "--parallel", str(parallel), "--json"]
            push_s, push_mb, _ = peak_rss([str(BIN / "neffcache"), "push", str(src), remote, *common], env)
            pull_s, pull_mb, _ = peak_rss([str(BIN / "neffcache"), "pull", remote, str(dst), *common], env)
            got = next(dst.rglob("model.neff")).stat().st_size
            assert got == args.size_mib << 20, got
            print(f"{parallel:>8} {push_s:>8.1f} {push_mb:>8.0f} {pull_s:>8.1f} {pull_mb:>8.0f}", flush=True)
            shutil.rmtree(dst)
    finally:
        moto.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
