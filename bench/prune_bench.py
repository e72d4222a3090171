"""Prune benchmarks: plan + execute on a big local cache vs ``rm -rf``; a plan over index rows.

    .venv/bin/python -m bench.prune_bench --entries 100000 --rounds 2
    .venv/bin/python -m bench.prune_bench --entries 0 --index-rows 1000000

Local: a layout-A cache as libneuronxla leaves it (no manifests), ``--entries`` entries of an
old compiler plus 1% of the current one, copied fresh for every run. neffcache plans
``--keep-compiler <current>`` (one listing of the whole cache) and executes it: per entry its
publish lease, a re-listing compared with the plan, the chunk journal, then marker, blobs and
the anchor file, and the lease dropped. The baseline removes the same paths (the old
``neuronxcc-<ver>/`` directory) with ``rm -rf``, which checks and promises nothing.

Index: ``--index-rows`` entries registered in an index server (SQLite, uvicorn on 127.0.0.1)
for one store; neffcache plans ``--keep-compiler`` from the index's rows (``--source index``,
no listing of the store). The baseline pages through the same rows over the same HTTP API
without doing anything with them: the plan's own cost is the difference. The server runs in its
own process (``uvicorn --factory``), as deployed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from bench.common import Timing, print_ratio, sh, timed
from neffcache.prune import PrunePolicy, execute_plan, plan_prune
from neffcache.stores.local import LocalStore

OLD = "2.21.33363.0+82129205"
NEW = "2.27.5334.0+f702b353"
NS = "trn2-lnc2"


def make_cache(root: Path, old: int, new: int) -> None:
    """Entries as libneuronxla writes them, small files (the cost of prune is per file, not per byte)."""
    hlo, neff = os.urandom(2048), os.urandom(8192)
    for version, count in ((OLD, old), (NEW, new)):
        ns = root / NS / f"neuronxcc-{version}"
        ns.mkdir(parents=True)
        for i in range(count):
            entry = ns / f"MODULE_{i}+d41d8cd9"
            entry.mkdir()
            (entry / "model.hlo_module.pb").write_bytes(hlo)
            (entry / "compile_flags.json").write_bytes(b"[]")
            (entry / "model.neff").write_bytes(neff)
            (entry / "model.done").write_bytes(b"")


def bench_local(entries: int, rounds: int, workers: int, base: Path) -> None:
    template = base / "template"
    started = time.monotonic()
    make_cache(template, entries, max(1, entries // 100))
    print(f"cache: {entries} old + {max(1, entries // 100)} current entries, 4 files each "
          f"(made in {time.monotonic() - started:.0f}s)")
    best: dict[str, float] = {}
    for r in range(rounds):
        times: list[Timing] = []
        for side in ("rm", "neffcache"):
            shutil.rmtree(base / side, ignore_errors=True)
            sh(f"cp -a {template} {base / side} && sync")
        with timed("rm -rf", times):
            sh(f"rm -rf {base / 'rm' / NS / f'neuronxcc-{OLD}'}")
        store = LocalStore(base / "neffcache")
        with timed("neffcache plan", times):
            plan = plan_prune([store], PrunePolicy(keep_compilers=(NEW,), current=NEW))
        with timed("neffcache execute", times):
            result = execute_plan(plan, [store], workers=workers, force=True)  # the bench empties a store
        assert len(result.removed) == entries and not result.skipped, result.skipped[:3]
        assert not (base / "neffcache" / NS / f"neuronxcc-{OLD}").exists()
        times.append(Timing("neffcache plan+execute", times[-1].seconds + times[-2].seconds))
        for t in times:
            best[t.label] = min(best.get(t.label, t.seconds), t.seconds)
        print(f"round {r + 1}: " + ", ".join(f"{t.label} {t.seconds:.2f}s" for t in times))
    print_ratio(f"prune {entries} entries (plan+execute, {workers} workers)", best["neffcache plan+execute"],
                best["rm -rf"], "rm -rf")
    print(f"  of which plan {best['neffcache plan']:.2f}s, execute {best['neffcache execute']:.2f}s")


def fill_index(url: str, rows: int, store_url: str) -> None:
    from sqlalchemy import insert

    from neffcache.server.storage.db import Database, migrate
    from neffcache.server.storage.models import Entry, EntryLocation, table_of

    db = Database(url, pool_size=2)
    migrate(db.engine)
    now = time.time()
    step = 50_000
    with db.engine.begin() as conn:
        for start in range(0, rows, step):
            batch = range(start, min(rows, start + step))
            conn.execute(insert(table_of(Entry)), [
                {"id": i + 1, "path": f"{NS}/neuronxcc-{OLD if i % 10 else NEW}/MODULE_{i}+d41d8cd9",
                 "layout": "neuronxcc", "key": f"MODULE_{i}+d41d8cd9",
                 "namespace": f"{NS}/neuronxcc-{OLD if i % 10 else NEW}", "compiler_version": OLD if i % 10 else NEW,
                 "target": "trn2", "lnc": 2, "toolchain": f"{NS}/neuronxcc-{OLD if i % 10 else NEW}",
                 "state": "SUCCESS", "size": 10_000 + i % 977, "neff_sha256": None, "created": now - i * 10,
                 "registered": now - i, "updated": now - i, "producer": "bench", "compile_seconds": 60.0,
                 "hit_count": i % 7, "last_used": now - i * 3 if i % 3 else None} for i in batch])
            conn.execute(insert(table_of(EntryLocation)),
                         [{"entry_id": i + 1, "store": store_url, "added": now} for i in batch])
    db.dispose()


def bench_index(rows: int, base: Path) -> None:
    import subprocess
    import sys

    import httpx

    from neffcache.index import open_index
    from neffcache.server.services.tokens import create_token
    from neffcache.server.storage.db import Database

    store = LocalStore(base / "index-store")
    url = f"sqlite:///{base / 'index.db'}"
    started = time.monotonic()
    fill_index(url, rows, store.url)
    db = Database(url, pool_size=1)
    with db.write() as session:
        token = create_token(session, "bench", "write")[1]
    db.dispose()
    print(f"index: {rows} rows for {store.url} (SQLite, filled in {time.monotonic() - started:.0f}s)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The server in its own process, as deployed: the client's work must not share its GIL.
    env = {**os.environ, "NEFFCACHE_SERVER_DATABASE_URL": url, "NEFFCACHE_SERVER_DATA_DIR": str(base / "data"),
           "NEFFCACHE_SERVER_TOKEN_CACHE_SECONDS": "60"}
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", "neffcache.server.app:create_app",
                               "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                               "--no-access-log"], env=env)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{endpoint}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the index server did not start")
            time.sleep(0.1)
        times: list[Timing] = []
        with timed("page through the rows", times), httpx.Client(
                base_url=endpoint, headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
            params: dict[str, object] = {"store": store.url, "limit": 1000}
            seen = 0
            while True:
                page = http.get("/v1/entries", params=params).json()
                seen += len(page["entries"])
                if page.get("next_cursor") is None:
                    break
                params["cursor"] = page["next_cursor"]
        assert seen == rows
        index = open_index(endpoint, token, spool_root=base / "spool", timeout=120.0)
        with timed("neffcache plan (--source index)", times):
            policy = PrunePolicy(keep_compilers=(NEW,), current=NEW, older_than=30 * 86400)
            plan = plan_prune([store], policy, index=index, source="index")
        index.close()
        for t in times:
            print(f"  {t.label}: {t.seconds:.2f}s")
        print(f"  plan: {plan.entries} entries, {plan.expected_freed_size / 1e9:.2f} GB "
              f"({', '.join(f'{k} {g.items}' for k, g in plan.by_reason().items())})")
        print_ratio(f"plan over {rows} index rows", times[1].seconds, times[0].seconds, "paging the rows",
                    f"({rows / times[1].seconds:,.0f} rows/s)")
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=100_000, help="Old-toolchain entries (0: skip).")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--index-rows", type=int, default=0, help="Index rows to plan over (0: skip).")
    parser.add_argument("--dir", type=Path, default=None, help="Scratch directory (default: a temp dir).")
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="neffcache-prune-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        if args.entries:
            bench_local(args.entries, args.rounds, args.workers, base)
        if args.index_rows:
            bench_index(args.index_rows, base)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
