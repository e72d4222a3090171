"""Index lookups as shipped: ``neffcache serve`` as deploy/k8s runs it, a read token, hits and misses.

    .venv/bin/python -m bench.index_shipped --entries 100000 --lookups 20000 --rounds 3

What runs: the container's ``args`` and literal ``env`` of deploy/k8s/index-deployment.yaml,
read from the file (``serve --workers 2``, the default log level, its pool size and token cache),
with only the address and port changed (127.0.0.1, a free port); the database and the bootstrap
admin token come from the environment as the deployment's secret gives them (SQLite in a
temporary directory unless ``--database postgresql``). The token asking is a read token made
the way an operator makes one (``neffcache token create --scope read``). Lookups are
``GET /v1/entries/{path}`` of random entries, ``--miss-fraction`` of them of paths the index does
not have (404), over ``--clients`` keep-alive connections from the load generator's own process
(bench/index_load.py). Every answer's status is checked.

Rows: hits and misses mixed, hits only, misses only; best of ``--rounds``. ``--access-log`` runs
the same server with its access log on, to show what that costs. The goal (issue 38): at least
3,000 lookups/s with p99 under 10 ms on SQLite, as shipped.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import yaml

from bench.index_bench import NAMESPACE, Run, best, database, paths, seed, timed
from bench.index_load import Generator, Load, request

DEPLOYMENT = Path(__file__).resolve().parent.parent / "deploy" / "k8s" / "index-deployment.yaml"
ADMIN = "bench-admin-token"  # what the deployment's secret would hold


def deployment() -> tuple[list[str], dict[str, str]]:
    """The index container's args and its literal env values (secrets are set apart)."""
    for doc in yaml.safe_load_all(DEPLOYMENT.read_text()):
        if doc and doc.get("kind") == "Deployment":
            container = doc["spec"]["template"]["spec"]["containers"][0]
            env = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
            return [str(a) for a in container["args"]], env
    raise SystemExit(f"no Deployment in {DEPLOYMENT}")


def shipped_args(port: int) -> list[str]:
    """The deployment's args with only --host and --port changed."""
    args, _ = deployment()
    out = []
    it = iter(args)
    for arg in it:
        if arg in ("--host", "--port"):
            next(it)
            continue
        out.append(arg)
    return [*out, "--host", "127.0.0.1", "--port", str(port)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def shipped_server(url: str, log: Path, extra: list[str]) -> Iterator[tuple[int, int, list[str]]]:
    """(port, pid, the command) of a server started as the deployment starts it."""
    port = free_port()
    _, literal = deployment()
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("NEFFCACHE_SERVER_")}
    env = {**inherited, **literal, "NEFFCACHE_SERVER_DATABASE_URL": url, "NEFFCACHE_SERVER_ADMIN_TOKEN": ADMIN}
    command = ["neffcache", *shipped_args(port), *extra]
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "neffcache.cli.main", *command[1:]], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            while True:  # as long as it takes: workers import the app slowly on a loaded machine
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}; see {log}")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            yield port, proc.pid, command
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def read_token(url: str) -> str:
    made = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "token", "create", "bench-read",
                           "--scope", "read", "--database-url", url], capture_output=True, text=True, check=True)
    return made.stdout.strip().splitlines()[0]


def lookups(port: int, token: str, asked: list[tuple[str, int]], clients: int) -> Load:
    return Load([request("GET", port, f"/v1/entries/{path}", token) for path, _ in asked], "lookup", clients,
                [status for _, status in asked])


def measure(url: str, args: argparse.Namespace, workdir: Path, extra: list[str]) -> tuple[list[str], dict[str, Run]]:
    rng = random.Random(5)
    present = paths(args.entries)
    hits = [(rng.choice(present), 200) for _ in range(args.lookups)]
    misses = [(f"{NAMESPACE}/MODULE_{2 * 10**12 + i}+{i % 65536:04x}ffff", 404) for i in range(args.lookups)]
    mixed = [misses[i] if rng.random() < args.miss_fraction else hits[i] for i in range(args.lookups)]
    token = read_token(url)
    rounds: list[dict[str, Run]] = []
    with shipped_server(url, workdir / "server.log", extra) as (port, pid, command), Generator(port) as gen:
        gen.run(lookups(port, token, mixed[:500], args.clients))  # token verified, page cache warm
        for _ in range(args.rounds):
            rounds.append({name: timed(gen, lookups(port, token, asked, args.clients), len(asked), pid)
                           for name, asked in (("mixed", mixed), ("hits", hits), ("misses", misses))})
    return command, {name: best([r[name] for r in rounds]) for name in rounds[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--miss-fraction", type=float, default=0.5, help="share of the mixed lookups that miss")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="best of this many rounds (noisy machines)")
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--access-log", action="store_true", help="serve with --access-log (what it costs)")
    args = parser.parse_args()
    with (tempfile.TemporaryDirectory(prefix="neffcache-index-shipped-") as tmp,
          database(args.database, Path(tmp)) as url):
        seconds = seed(url, args.entries)
        print(f"seeded {args.entries:,} entries in {seconds:.1f}s", file=sys.stderr)
        command, runs = measure(url, args, Path(tmp), ["--access-log"] if args.access_log else [])
    load = os.getloadavg()
    print(f"\nindex lookups as shipped: `{' '.join(command)}` ({args.database}, {args.entries:,} entries), "
          f"a read token, {args.clients} clients, best of {args.rounds} rounds, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {load[0]:.1f} / {load[1]:.1f} (1 / 5 min)\n")
    header = f"{'lookups':<28}{'per s':>9}{'p50 ms':>8}{'p99 ms':>8}{'CPU us':>8}  goal >= 3,000/s, p99 < 10 ms"
    print(header)
    print("-" * len(header))
    for name, label in (("mixed", f"mixed, {args.miss_fraction:.0%} misses"), ("hits", "hits only"),
                        ("misses", "misses only")):
        run = runs[name]
        cpu = (run.cpu_per_item or 0.0) * 1e6
        met = "met" if run.rate >= 3000 and run.p99 < 10 else "not met"
        print(f"{label:<28}{run.rate:>9,.0f}{run.p50:>8.2f}{run.p99:>8.2f}{cpu:>8.0f}  {met}")
    print("\nCPU us = server CPU per lookup, all processes (supervisor and workers).")


if __name__ == "__main__":
    main()
