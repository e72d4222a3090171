"""Peak RSS of publish, push, pull and verify of one big NEFF with S3 (moto), by ``--parallel``.

    .venv/bin/python -m bench.memory_bench --size-mib 2048 --parallel 16,64

One layout-A entry whose ``model.neff`` is a sparse file of ``--size-mib`` MiB, once per
``--parallel``, each operation a ``neffcache`` process of its own:

- *publish*: the entry as the runtime wrote it (no manifest) pushed to S3, its manifest made of
  the digests of the bytes sent;
- *push*: the same entry with its manifest (neffcache-managed) pushed to S3;
- *pull*: pulled back into an empty local store;
- *verify*: ``neffcache verify`` of the S3 copy (every byte downloaded and hashed).

Peak RSS is each process's own high-water mark (VmHWM, :data:`bench.common.HWM_LAUNCHER`), not
the moto server's. The NEFF is sparse so the bench needs no disk for the source; moto keeps
objects in memory (about twice their size while it assembles the parts), so 2 GiB needs ~9 GB
free (two copies in the bucket).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import neffcache_measured
from bench.s3_bench import BUCKET, MotoProcess
from neffcache.layouts import get_layout
from neffcache.operations.ingest import build_manifest
from neffcache.toolchain import Toolchain

TC = Toolchain("2.27.5334.0+f702b353", "trn2", 2)
KEY = "MODULE_4242+d41d8cd9"
OPERATIONS = ("publish", "push", "pull", "verify")


def make_entry(root: Path, size: int, *, manifest: bool = True) -> str:
    """A layout-A entry with a sparse ``model.neff`` of ``size`` bytes (and its manifest)."""
    layout = get_layout("neuronxcc")
    plan = layout.plan_entry(layout.namespace_for(TC), KEY)
    entry = root / plan.base
    entry.mkdir(parents=True)
    (entry / "model.hlo_module.pb").write_bytes(b"HLO " + KEY.encode())
    (entry / "compile_flags.json").write_bytes(b"[]")
    with open(entry / "model.neff", "wb") as f:
        f.write(b"NEFF")
        f.truncate(size)
    (entry / "model.done").touch()
    if manifest:
        files = {n: entry / n for n in ("model.hlo_module.pb", "compile_flags.json", "model.neff", "model.done")}
        (entry / "neffcache.json").write_bytes(build_manifest("neuronxcc", KEY, files, toolchain=TC).to_bytes())
    return plan.path


def peak_rss(args: list[str], env: dict[str, str], scratch: Path) -> tuple[float, float, str]:
    """(seconds, peak RSS in MB of that ``neffcache`` process alone, stdout)."""
    hwm = scratch / "vmhwm"
    hwm.unlink(missing_ok=True)
    start = time.perf_counter()
    proc = subprocess.run(neffcache_measured(hwm, args), env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"neffcache {' '.join(args[:3])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return seconds, int(hwm.read_text()) / 1024, proc.stdout


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
        managed, runtime = base / "managed", base / "runtime"
        make_entry(managed, args.size_mib << 20)
        make_entry(runtime, args.size_mib << 20, manifest=False)
        time.sleep(1.1)  # older than hashed_io.SETTLE: the push reads each file once
        print(f"one entry, model.neff {args.size_mib} MiB (sparse); moto_server at {moto.url}")
        print(f"{'parallel':>8} " + " ".join(f"{op + ' s':>10} {op + ' MB':>10}" for op in OPERATIONS), flush=True)
        for parallel in (int(p) for p in args.parallel.split(",")):
            moto.fresh_bucket()
            dst = base / f"pull-{parallel}"
            common = ["--endpoint-url", moto.url, "--parallel", str(parallel), "--json"]
            commands = {
                "publish": ["push", str(runtime), f"s3://{BUCKET}/runtime", *common],
                "push": ["push", str(managed), f"s3://{BUCKET}/mem", *common],
                "pull": ["pull", f"s3://{BUCKET}/mem", str(dst), *common],
                "verify": ["verify", f"s3://{BUCKET}/mem", "--endpoint-url", moto.url, "--json"],
            }
            row = [peak_rss(commands[op], env, base)[:2] for op in OPERATIONS]
            got = next(dst.rglob("model.neff")).stat().st_size
            assert got == args.size_mib << 20, got
            print(f"{parallel:>8} " + " ".join(f"{s:>10.1f} {mb:>10.0f}" for s, mb in row), flush=True)
            shutil.rmtree(dst)
    finally:
        moto.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
