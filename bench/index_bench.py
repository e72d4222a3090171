"""Index server: lookups/s with p50/p99 over >=100k entries, and events ingested/s, on SQLite and
PostgreSQL, each against a bare SQL loop on the same database (the baseline of the ratio).

    .venv/bin/python -m bench.index_bench --entries 100000 --databases sqlite,postgresql

This is the lab bench (an admin token, hits only, ``--log-level warning``, a pool of 20): it
isolates the server's costs and covers events and batch lookups. The lookups of record are
measured as shipped, the deployment's configuration with a read token, hits and misses:
bench/index_shipped.py.

What runs: the real server (``neffcache serve``, one process unless --workers) on 127.0.0.1,
queried over --clients keep-alive HTTP connections by a load generator in its own process
(bench/index_load.py; its CPU is printed beside the server's), bearer token checked on every
request; the server's peak RSS is printed too. Lookups are GET /v1/entries/{path} of random entries
(the entry row, its stores and tags). Batch lookups are POST /v1/entries/lookup of --batch-keys
random paths per request (what `neffcache plan` sends), from one client and from --clients.
Ingest is POST /v1/events of --batch events per request (dedup insert, hourly rollup upsert,
hit stamps on entries).
Baselines use the DB-API driver directly (sqlite3 / psycopg), one connection, no HTTP:
the same SELECTs for a lookup; for a batch, SELECT ... WHERE path IN (...) and the stores and
tags of the rows found, WHERE entry_id IN (...); a plain executemany INSERT of the same event
rows per batch. Batch lookups are also set against the single-key loop over HTTP (the same keys
asked one request each), which is what a batch replaces.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.index_load import Generator, Load, request
from neffcache.index.records import new_event_id
from neffcache.server.services import catalog
from neffcache.server.services.identity import Writer
from neffcache.server.services.records import EntryIn
from neffcache.server.storage.db import Database, migrate

COMPILER = "2.27.5334.0+f702b353"
NAMESPACE = f"trn2-lnc2/neuronxcc-{COMPILER}"
POSTGRES_URL = os.environ.get("NEFFCACHE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
ADMIN = "bench-admin-token"


@dataclass
class Result:
    database: str
    what: str
    rate: float
    p50_ms: float
    p99_ms: float
    baseline_rate: float
    baseline_p50_ms: float
    baseline_p99_ms: float
    cpu_per_item: float | None  # server CPU seconds per lookup / per event
    client_cpu_per_item: float | None  # the load generator's, likewise
    cores: list[float] | None = None  # cores each server process kept busy (supervisor first)

    @property
    def ratio(self) -> float:
        return self.rate / self.baseline_rate


def entry_records(count: int) -> Iterator[list[EntryIn]]:
    rng = random.Random(3)
    now = time.time()
    batch: list[EntryIn] = []
    for i in range(count):
        key = f"MODULE_{10**12 + i}+{i % 65536:04x}abcd"
        batch.append(EntryIn.model_validate({
            "path": f"{NAMESPACE}/{key}", "layout": "neuronxcc", "key": key, "namespace": NAMESPACE,
            "toolchain": {"compiler_version": COMPILER, "target": "trn2", "lnc": 2}, "state": "SUCCESS",
            "size": rng.randint(144_000, 17_500_000), "neff_sha256": f"{rng.getrandbits(256):064x}",
            "store": "s3://bench/prefix", "tags": {"team": f"team-{i % 7}", "model": f"model-{i % 23}"},
            "created": now - rng.uniform(0, 86400 * 30), "producer": "bench", "compile_seconds": rng.uniform(5, 900),
            "hlo_sha256": f"{rng.getrandbits(256):064x}", "hlo_size": rng.randint(10_000, 50_000_000),
            "flags": ["--model-type=transformer", "--auto-cast=none", "-O1"],
        }))
        if len(batch) == 5000:
            yield batch
            batch = []
    if batch:
        yield batch


def paths(count: int) -> list[str]:
    return [f"{NAMESPACE}/MODULE_{10**12 + i}+{i % 65536:04x}abcd" for i in range(count)]


def events(count: int, entry_count: int, rng: random.Random) -> list[dict[str, Any]]:
    """Events as neffcache's client sends them: its ids (time-ordered, new_event_id), hits of random
    entries, timestamps spread over the last day (spools drain late)."""
    now = time.time()
    out = []
    for _ in range(count):
        kind = rng.choice(("hit", "hit", "hit", "miss", "compile"))
        i = rng.randrange(entry_count)
        out.append({
            "id": new_event_id(), "kind": kind, "ts": now - rng.uniform(0, 86400),
            "path": f"{NAMESPACE}/MODULE_{10**12 + i}+{i % 65536:04x}abcd", "key": None, "namespace": NAMESPACE,
            "toolchain": {"compiler_version": COMPILER, "target": "trn2", "lnc": 2}, "job": "bench-job",
            "model": f"model-{i % 23}", "team": f"team-{i % 7}", "host": f"host-{i % 50}",
            "instance_type": "trn2.48xlarge", "compile_seconds": rng.uniform(5, 900) if kind == "compile" else None,
            "store": None, "message": None,
        })
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


@contextmanager
def database(kind: str, workdir: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{workdir / 'bench.db'}"
        return
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    raw = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(raw, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(raw, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


BENCH_WRITER = Writer("bench")  # seeded entries are the bench token's


def seed(url: str, count: int) -> float:
    db = Database(url, pool_size=2)
    migrate(db.engine)
    started = time.perf_counter()
    for batch in entry_records(count):
        db.transact(lambda s, batch=batch: catalog.register_entries(s, batch, time.time(), BENCH_WRITER))
    if db.dialect == "postgresql":
        with db.engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE")
            conn.commit()
    db.dispose()
    return time.perf_counter() - started


def cpu_by_process(pid: int) -> dict[int, float]:
    """CPU time (user + system) of a process and of each of its children (uvicorn workers), from
    /proc. Per-request CPU is the figure that survives a noisy shared machine; wall-clock rates
    do not. Per process, it shows whether the workers shared the load."""
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    found = {}
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[p] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return found


def cpu_seconds(pid: int) -> float:
    return sum(cpu_by_process(pid).values())


@contextmanager
def server(url: str, workers: int, log: Path) -> Iterator[tuple[str, int]]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "NEFFCACHE_SERVER_DATABASE_URL": url, "NEFFCACHE_SERVER_ADMIN_TOKEN": ADMIN,
           "NEFFCACHE_SERVER_POOL_SIZE": "20"}
    with open(log, "wb") as out:
        # `neffcache serve`, not bare `uvicorn --workers`: see listening_socket in server/app.py.
        proc = subprocess.Popen([sys.executable, "-m", "neffcache.cli.main", "serve", "--port", str(port),
                                 "--workers", str(workers), "--log-level", "warning"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 180  # workers import the app slowly on a loaded machine
            while True:
                try:
                    if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"server did not start; see {log}")
                time.sleep(0.1)
            yield port, proc.pid
        except BaseException:
            out.flush()
            tail = log.read_text(errors="replace").splitlines()[-40:]
            print(f"server log ({log}), last lines:\n" + "\n".join(tail), file=sys.stderr)
            raise
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def lookup_load(port: int, wanted: list[str], clients: int) -> Load:
    return Load([request("GET", port, f"/v1/entries/{path}", ADMIN) for path in wanted], "lookup", clients)


def timed(generator: Generator, load: Load, items: int, pid: int | None = None) -> Run:
    """One loop of the load generator; ``pid``: the server whose CPU per item is measured."""
    before = cpu_by_process(pid) if pid is not None else {}
    outcome = generator.run(load)
    RETRIED_503[0] += outcome.retried_503
    RECONNECTS[0] += outcome.reconnects
    if pid is None:
        return Run(items / outcome.seconds, outcome.latencies, None, outcome.cpu_seconds / items)
    spent = {p: seconds - before.get(p, 0.0) for p, seconds in cpu_by_process(pid).items()}
    return Run(items / outcome.seconds, outcome.latencies, sum(spent.values()) / items,
               outcome.cpu_seconds / items, [spent[p] / outcome.seconds for p in sorted(spent)])


RETRIED_503 = [0]
RECONNECTS = [0]


class BareSQL:
    """The baseline: the driver, one connection, the same statements, no HTTP, no framework."""

    def __init__(self, url: str) -> None:
        self.sqlite = url.startswith("sqlite")
        if self.sqlite:
            self.conn: Any = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.mark = "?"
        else:
            import psycopg

            raw, _, query = url.replace("postgresql+psycopg://", "postgresql://").partition("?")
            schema = query.split("search_path%3D", 1)[1]
            self.conn = psycopg.connect(raw, options=f"-csearch_path={schema}")
            self.mark = "%s"

    def lookup(self, path: str) -> None:
        m = self.mark
        cur = self.conn.cursor()
        cur.execute(f"SELECT * FROM entries WHERE path = {m}", (path,))
        row = cur.fetchone()
        cur.execute(f"SELECT store FROM entry_locations WHERE entry_id = {m}", (row[0],))
        cur.fetchall()
        cur.execute(f"SELECT name, value FROM entry_tags WHERE entry_id = {m}", (row[0],))
        cur.fetchall()
        if not self.sqlite:
            self.conn.commit()

    def lookup_in(self, paths: list[str]) -> None:
        """A batch as the server answers it, in the fewest statements the driver allows: the rows
        (one IN list), then their stores and their tags (one IN list of ids each)."""
        marks = ", ".join([self.mark] * len(paths))
        cur = self.conn.cursor()
        cur.execute(f"SELECT * FROM entries WHERE path IN ({marks})", paths)
        ids = [row[0] for row in cur.fetchall()]
        id_marks = ", ".join([self.mark] * len(ids))
        cur.execute(f"SELECT entry_id, store FROM entry_locations WHERE entry_id IN ({id_marks})", ids)
        cur.fetchall()
        cur.execute(f"SELECT entry_id, name, value FROM entry_tags WHERE entry_id IN ({id_marks})", ids)
        cur.fetchall()
        if not self.sqlite:
            self.conn.commit()

    def insert(self, batch: list[dict[str, Any]]) -> None:
        m = self.mark
        columns = ("event_id", "kind", "ts", "path", "key", "namespace", "toolchain", "job", "model", "team",
                   "host", "instance_type", "compile_seconds", "store", "message", "received")
        sql = f"INSERT INTO events ({', '.join(columns)}) VALUES ({', '.join([m] * len(columns))})"
        now = time.time()
        rows = [(e["id"], e["kind"], e["ts"], e["path"], e["key"], e["namespace"], NAMESPACE, e["job"], e["model"],
                 e["team"], e["host"], e["instance_type"], e["compile_seconds"], e["store"], e["message"], now)
                for e in batch]
        if self.sqlite:
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany(sql, rows)
            self.conn.execute("COMMIT")
        else:
            with self.conn.cursor() as cur:
                cur.executemany(sql, rows)
            self.conn.commit()

    def close(self) -> None:
        self.conn.close()


def timed_loop(jobs: list[Any], fn: Callable[[Any], None]) -> tuple[float, list[float]]:
    latencies = []
    started = time.perf_counter()
    for job in jobs:
        t = time.perf_counter()
        fn(job)
        latencies.append(time.perf_counter() - t)
    return time.perf_counter() - started, latencies


@dataclass
class Run:
    """One timed loop: rate, latencies, the server CPU it cost and the load generator's (None
    for baselines), per item."""

    rate: float
    latencies: list[float]
    cpu_per_item: float | None = None
    client_cpu_per_item: float | None = None
    # Cores each server process kept busy during the loop (supervisor first): whether the
    # workers shared the load, and how far the server was from using the machine.
    cores: list[float] | None = None

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 0.5)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 0.99)


def best(runs: list[Run]) -> Run:
    """Best of the rounds: on a shared machine the fastest round is the one least disturbed."""
    return max(runs, key=lambda run: run.rate)


def batch_rounds(gen: Generator, pid: int, args: argparse.Namespace, bare: BareSQL, all_paths: list[str],
                 rng: random.Random) -> dict[str, Run]:
    """Batch lookups of ``--batch-keys`` paths: rates in keys per second, latencies per batch."""
    keys = args.batch_keys
    asked = [rng.sample(all_paths, keys) for _ in range(args.batch_lookups)]
    bodies = [request("POST", gen.port, "/v1/entries/lookup", ADMIN, json.dumps({"paths": paths}).encode())
              for paths in asked]
    runs: dict[str, Run] = {}
    seconds, latencies = timed_loop(asked, bare.lookup_in)
    runs["sql batch"] = Run(len(asked) * keys / seconds, latencies)
    runs["batch 1"] = timed(gen, Load(bodies, "batch", 1), len(bodies) * keys, pid)
    runs["batch n"] = timed(gen, Load(bodies, "batch", args.clients), len(bodies) * keys, pid)
    single = asked[0][: max(1, args.lookups // 5)]  # the same keys, one request each
    runs["single loop"] = timed(gen, lookup_load(gen.port, single, 1), len(single))
    return runs


def one_round(url: str, gen: Generator, pid: int, args: argparse.Namespace, wanted: list[str],
              rng: random.Random, all_paths: list[str]) -> dict[str, Run]:
    sent_batches = [events(args.batch, args.entries, rng) for _ in range(args.events // args.batch)]
    ingest = Load([request("POST", gen.port, "/v1/events", ADMIN, json.dumps(batch).encode())
                   for batch in sent_batches], "ingest", args.clients, [len(batch) for batch in sent_batches])
    baseline_batches = [events(args.batch, args.entries, rng) for _ in range(len(sent_batches))]
    runs: dict[str, Run] = {}
    bare = BareSQL(url)
    try:
        seconds, latencies = timed_loop(wanted, bare.lookup)
        runs["sql lookups"] = Run(len(wanted) / seconds, latencies)
        single = wanted[: max(1, len(wanted) // 5)]
        runs["lookups 1"] = timed(gen, lookup_load(gen.port, single, 1), len(single), pid)
        runs["lookups n"] = timed(gen, lookup_load(gen.port, wanted, args.clients), len(wanted), pid)
        sent = len(sent_batches) * args.batch
        seconds, latencies = timed_loop(baseline_batches, bare.insert)
        runs["sql events"] = Run(sent / seconds, latencies)
        runs["events"] = timed(gen, ingest, sent, pid)
        if args.batch_lookups:
            runs.update(batch_rounds(gen, pid, args, bare, all_paths, rng))
    finally:
        bare.close()
    return runs


def bench_database(kind: str, args: argparse.Namespace, workdir: Path) -> list[Result]:
    rng = random.Random(11)
    with database(kind, workdir) as url:
        seconds = seed(url, args.entries)
        print(f"[{kind}] seeded {args.entries:,} entries in {seconds:.1f}s", file=sys.stderr)
        all_paths = paths(args.entries)
        wanted = [rng.choice(all_paths) for _ in range(args.lookups)]
        rounds: list[dict[str, Run]] = []
        with server(url, args.workers, workdir / f"server-{kind}.log") as (port, pid), Generator(port) as gen:
            gen.run(lookup_load(port, wanted[:500], args.clients))  # warm-up (and the page cache)
            for n in range(args.rounds):
                rounds.append(one_round(url, gen, pid, args, wanted, rng, all_paths))
                print(f"[{kind}] round {n + 1}/{args.rounds} done", file=sys.stderr)
            PEAK_RSS[kind] = peak_rss_kib(pid)
    pick = {name: best([r[name] for r in rounds]) for name in rounds[0]}

    def result(what: str, ours: Run, baseline: Run) -> Result:
        return Result(kind, what, ours.rate, ours.p50, ours.p99, baseline.rate, baseline.p50, baseline.p99,
                      ours.cpu_per_item, ours.client_cpu_per_item, ours.cores)

    results = [
        result("lookups, 1 client", pick["lookups 1"], pick["sql lookups"]),
        result(f"lookups, {args.clients} clients", pick["lookups n"], pick["sql lookups"]),
        result(f"events, {args.batch}/request", pick["events"], pick["sql events"]),
    ]
    if args.batch_lookups:
        keys = args.batch_keys
        results += [result(f"batch {keys}, 1 client", pick["batch 1"], pick["sql batch"]),
                    result(f"batch {keys}, {args.clients} clients", pick["batch n"], pick["sql batch"])]
        SINGLE_LOOP[kind] = pick["single loop"]
    return results


def peak_rss_kib(pid: int) -> list[tuple[int, int, int]]:
    """Per server process (the server and each of its workers, read while alive): peak RSS
    (VmHWM), and at the end of the run its anonymous memory (RssAnon, the process's own) and its
    file pages (RssFile: SQLite's memory-mapped index, page cache every worker shares), KiB."""
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    found = []
    for p in pids:
        with contextlib.suppress(OSError, IndexError):
            status = Path(f"/proc/{p}/status").read_text()
            peak, anon, files = (int(status.split(f"{name}:", 1)[1].split()[0])
                                 for name in ("VmHWM", "RssAnon", "RssFile"))
            found.append((peak, anon, files))
    return found


PEAK_RSS: dict[str, list[tuple[int, int, int]]] = {}
SINGLE_LOOP: dict[str, Run] = {}  # per database: the single-key loop the batch rows are set against


def print_table(results: list[Result], args: argparse.Namespace) -> None:
    print(f"\nindex server, {args.entries:,} entries, {args.clients} client connections (load generator: its own "
          f"process), {args.workers} server process(es), {os.cpu_count()} cores, best of {args.rounds} rounds; "
          "baseline = bare SQL loop, same database, one connection\n")
    header = (f"{'database':<11}{'what':<22}{'server/s':>10}{'p50 ms':>8}{'p99 ms':>8}{'CPU us':>8}{'gen us':>8}"
              f"{'bare SQL/s':>12}{'p50 ms':>8}{'p99 ms':>8}{'ratio':>7}")
    print(header)
    print("-" * len(header))
    for r in results:
        cpu = f"{r.cpu_per_item * 1e6:>8.0f}" if r.cpu_per_item is not None else f"{'':>8}"
        gen = f"{r.client_cpu_per_item * 1e6:>8.1f}" if r.client_cpu_per_item is not None else f"{'':>8}"
        print(f"{r.database:<11}{r.what:<22}{r.rate:>10,.0f}{r.p50_ms:>8.2f}{r.p99_ms:>8.2f}{cpu}{gen}"
              f"{r.baseline_rate:>12,.0f}{r.baseline_p50_ms:>8.2f}{r.baseline_p99_ms:>8.2f}{r.ratio:>7.2f}")
    print("\nratio = server rate / bare SQL rate. CPU us = server CPU per lookup / per event / per key of a batch\n"
          "(all workers); gen us = the load generator's own CPU per item (its process, timed loop only).\n"
          "Latency of events and of batch lookups is per request (one batch); batch rates are keys/s,\n"
          "their bare SQL baseline one IN-list SELECT of the rows plus one each of their stores and tags.")
    for kind, single in SINGLE_LOOP.items():
        batch = next(r for r in results if r.database == kind and r.what.endswith(", 1 client")
                     and r.what.startswith("batch"))
        print(f"{kind}: batch lookups, 1 client, {batch.rate:,.0f} keys/s vs the single-key loop over HTTP, "
              f"1 client, {single.rate:,.0f} keys/s (p99 {single.p99:.2f} ms a key): {batch.rate / single.rate:.1f}x")
    for r in results:
        if r.cores and len(r.cores) > 1:
            print(f"{r.database}, {r.what}: cores busy per server process "
                  f"{' + '.join(f'{c:.2f}' for c in r.cores)} = {sum(r.cores):.2f} of {os.cpu_count()}")
    for kind, memory in PEAK_RSS.items():
        peaks, anon, files = ([m[i] / 1024 for m in memory] for i in range(3))
        print(f"{kind}: server peak RSS {sum(peaks):,.0f} MiB over {len(peaks)} process(es) "
              f"({', '.join(f'{p:,.0f}' for p in peaks)} MiB; supervisor first when --workers > 1); at the end, "
              f"anonymous {', '.join(f'{a:,.0f}' for a in anon)} MiB, file pages (the mapped index, shared) "
              f"{', '.join(f'{f:,.0f}' for f in files)} MiB")
    print(f"Load average during the run: {os.getloadavg()[0]:.1f} (1 min), {os.getloadavg()[1]:.1f} (5 min); "
          f"ingest requests retried after a 503: {RETRIED_503[0]}; keep-alive connections the server closed "
          f"while idle, reopened: {RECONNECTS[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--batch-lookups", type=int, default=100, help="batch lookups per round (0: none)")
    parser.add_argument("--batch-keys", type=int, default=1000, help="paths per batch lookup")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--rounds", type=int, default=3, help="best of this many rounds (noisy machines)")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C: the server process is stopped and the PostgreSQL schema dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="neffcache-index-bench-") as tmp:
        for kind in args.databases.split(","):
            try:
                results += bench_database(kind.strip(), args, Path(tmp))
            except (OSError, ImportError) as exc:
                if kind.strip() != "postgresql":
                    raise
                print(f"[postgresql] skipped: {exc}", file=sys.stderr)
    print_table(results, args)


if __name__ == "__main__":
    main()
