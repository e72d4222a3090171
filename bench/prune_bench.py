"""Prune benchmarks: plan + execute on a big local cache vs ``rm -rf``; a plan over index rows.

    .venv/bin/python -m bench.prune_bench --entries 100000 --rounds 2
    .venv/bin/python -m bench.prune_bench --entries 1000000 --rounds 1 --layout b --dir /big/scratch
    .venv/bin/python -m bench.prune_bench --entries 0 --index-rows 1000000

Local: ``--entries`` entries of an old compiler plus 1% of the current one, built fresh for
each side of every round with descriptors (``openat``; not timed), tiny files (the cost is per
file and directory; 1M entries must fit the disk). ``--layout a``: libneuronxla's
``MODULE_<i>+d41d8cd9/`` directories (4 files, no manifests); ``--layout b``: TorchNeuron's
native cache, ``torchneuron-<ver>/neff/<k0k1>/<k2k3>/<key>.neff`` plus ``hlo/.../<key>.hlo``,
32-hex keys. neffcache plans ``--keep-compiler <current>`` (one listing of the whole cache) and
executes it: per chunk a prune group lease and the journal, per entry a look for its publish
lease, a re-listing compared with the plan, then marker, blobs and the anchor file. Plan and
execute are timed apart. The baseline removes the same paths (the old ``<runtime>-<ver>/``
directory) with ``rm -rf``, which checks and promises nothing. ``--cli`` (the default) also
runs ``neffcache prune --yes`` on a fresh copy in its own process and reports its peak RSS
(VmHWM).

Index: ``--index-rows`` entries registered in an index server (SQLite, uvicorn on 127.0.0.1)
for one store; neffcache plans ``--keep-compiler`` from the index's rows (``--source index``,
no listing of the store). The baseline pages through the same rows over the same HTTP API
without doing anything with them: the plan's own cost is the difference. The server runs in its
own process (``uvicorn --factory``), as deployed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import Timing, cpu_seconds, load_average, neffcache_measured, print_ratio, sh, timed
from neffcache.prune import PrunePolicy, execute_plan, plan_prune
from neffcache.prune.execute import workers_for
from neffcache.stores.local import LocalStore

OLD = "2.21.33363.0+82129205"
NEW = "2.27.5334.0+f702b353"
NS = "trn2-lnc2"
# Tiny contents: the cost of a prune is per file and directory, not per byte, and 1M entries
# must fit the disk (each non-empty file still takes a 4 KiB block on ext4).
A_FILES = (("model.hlo_module.pb", b"HLO-0123"), ("compile_flags.json", b"[]"), ("model.neff", b"NEFF0123"),
           ("model.done", b""))
B_FILES = (("neff", ".neff", b"NEFF0123"), ("hlo", ".hlo", b""))  # an HLO's bytes matter to no prune rule
FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def namespace(layout: str, version: str) -> str:
    return f"{NS}/{'neuronxcc' if layout == 'a' else 'torchneuron'}-{version}"


def _mkdirs(parent: int, names: list[str]) -> int:
    """Make (or open) ``names`` below the directory ``parent``; returns the last one's descriptor."""
    fd = os.dup(parent)
    for name in names:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=fd)
        nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd


def _write(fd: int, name: str, data: bytes) -> None:
    out = os.open(name, FILE_FLAGS, 0o644, dir_fd=fd)
    if data:
        os.write(out, data)
    os.close(out)


def build_tree(root: Path, layout: str, old: int, new: int) -> tuple[int, int]:
    """A cache of ``old`` entries of an old compiler and ``new`` of the current one, written with
    descriptors (openat, no path resolved twice): 1M entries in minutes, not an hour.

    Layout A: ``<ns>/neuronxcc-<ver>/MODULE_<i>+d41d8cd9/`` with libneuronxla's four files.
    Layout B (TorchNeuron's native cache): ``<ns>/torchneuron-<ver>/neff/<k0k1>/<k2k3>/<key>.neff``
    and ``hlo/<k0k1>/<k2k3>/<key>.hlo``, 32-hex keys. Returns (files, bytes written)."""
    root.mkdir(parents=True, exist_ok=True)
    rfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    files = size = 0
    try:
        for version, count in ((OLD, old), (NEW, new)):
            nsfd = _mkdirs(rfd, namespace(layout, version).split("/"))
            try:
                if layout == "a":
                    for i in range(count):
                        efd = _mkdirs(nsfd, [f"MODULE_{i}+d41d8cd9"])
                        for name, data in A_FILES:
                            _write(efd, name, data)
                        os.close(efd)
                    files, size = files + 4 * count, size + count * sum(len(d) for _, d in A_FILES)
                else:
                    keys = sorted(hashlib.md5(f"{version}-{i}".encode()).hexdigest() for i in range(count))
                    for kind, suffix, data in B_FILES:
                        shard, sfd = "", -1
                        for key in keys:
                            if key[:4] != shard:
                                if sfd >= 0:
                                    os.close(sfd)
                                shard, sfd = key[:4], _mkdirs(nsfd, [kind, key[:2], key[2:4]])
                            _write(sfd, key + suffix, data)
                        if sfd >= 0:
                            os.close(sfd)
                    files, size = files + 2 * count, size + count * sum(len(d) for _, _, d in B_FILES)
            finally:
                os.close(nsfd)
    finally:
        os.close(rfd)
    return files, size


def fresh(base: Path, side: str, layout: str, entries: int) -> Path:
    """A new copy of the cache for one side of a round (built, not timed; flushed to disk)."""
    root = base / side
    shutil.rmtree(root, ignore_errors=True)
    build_tree(root, layout, entries, max(1, entries // 100))
    os.sync()
    return root


def run_cli(root: Path, base: Path, workers: int | None) -> tuple[float, float, int]:
    """``neffcache prune --keep-compiler current --yes`` in its own process: (seconds, CPU
    seconds, peak RSS kB)."""
    hwm = base / "hwm"
    cmd = neffcache_measured(hwm, ["prune", "--store", str(root), "--keep-compiler", "current",
                                   "--compiler-version", NEW, "--no-index",
                                   *(["--workers", str(workers)] if workers else []), "--yes", "--force"])
    env = {**os.environ, "NEFFCACHE_INDEX_URL": ""}
    started, cpu = time.perf_counter(), cpu_seconds()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started, cpu_seconds() - cpu, int(hwm.read_text())


def bench_local(entries: int, rounds: int, workers: int | None, base: Path, layout: str, cli: bool) -> None:
    new = max(1, entries // 100)
    per_entry = len(A_FILES) if layout == "a" else len(B_FILES)
    blocks = sum(1 for _, d in A_FILES if d) if layout == "a" else sum(1 for _, _, d in B_FILES if d)
    contents = sum(len(d) for _, d in A_FILES) if layout == "a" else sum(len(d) for _, _, d in B_FILES)
    print(f"cache (layout {layout.upper()}): {entries} old + {new} current entries, {per_entry} files each, "
          f"{contents} bytes of contents per entry (~{(entries + new) * blocks * 4 // 1024} MiB on disk, "
          f"a 4 KiB block per non-empty file); load average {load_average()}")
    old_ns = namespace(layout, OLD)
    best: dict[str, float] = {}
    best_cpu: dict[str, float] = {}
    for r in range(rounds):
        times: list[Timing] = []
        started = time.monotonic()
        rm_root = fresh(base, "rm", layout, entries)
        built = time.monotonic() - started
        with timed("rm -rf", times):
            sh(f"rm -rf {rm_root / old_ns}")
        shutil.rmtree(rm_root)
        store = LocalStore(fresh(base, "neffcache", layout, entries))
        with timed("neffcache plan", times):
            plan = plan_prune([store], PrunePolicy(keep_compilers=(NEW,), current=NEW))
        with timed("neffcache execute", times):
            result = execute_plan(plan, [store], workers=workers, force=True)  # the bench empties a store
        assert len(result.removed) == entries and not result.skipped, result.skipped[:3]
        assert not (base / "neffcache" / old_ns).exists()
        times.append(Timing("neffcache plan+execute", times[-1].seconds + times[-2].seconds,
                            times[-1].cpu + times[-2].cpu))
        for t in times:
            best[t.label] = min(best.get(t.label, t.seconds), t.seconds)
            best_cpu[t.label] = min(best_cpu.get(t.label, t.cpu), t.cpu)
        print(f"round {r + 1} (each tree built in {built:.0f}s, untimed): "
              + ", ".join(f"{t.label} {t.seconds:.2f}s (cpu {t.cpu:.2f}s)" for t in times)
              + f"; load average {load_average()}")
    threads = workers_for(store, workers)  # what the rounds ran with
    shutil.rmtree(base / "neffcache", ignore_errors=True)
    title = f"prune {entries} entries, layout {layout.upper()}"
    print_ratio(f"{title} (plan+execute, {threads} worker{'s' if threads > 1 else ''})",
                best["neffcache plan+execute"], best["rm -rf"], "rm -rf")
    print_ratio(f"{title} (execute alone)", best["neffcache execute"], best["rm -rf"], "rm -rf")
    print(f"  of which plan {best['neffcache plan']:.2f}s, execute {best['neffcache execute']:.2f}s")
    print_ratio(f"{title} (plan+execute, CPU user+sys)", best_cpu["neffcache plan+execute"], best_cpu["rm -rf"],
                "rm -rf")
    print(f"  CPU: plan {best_cpu['neffcache plan']:.2f}s, execute {best_cpu['neffcache execute']:.2f}s, "
          f"rm -rf {best_cpu['rm -rf']:.2f}s")
    if cli:
        seconds, cpu, peak = run_cli(fresh(base, "cli", layout, entries), base, workers)
        shutil.rmtree(base / "cli", ignore_errors=True)
        print(f"  neffcache prune --yes (own process): {seconds:.2f}s (cpu {cpu:.2f}s), peak RSS {peak / 1024:.0f} MiB "
              f"({peak * 1024 / (entries + new):.0f} bytes per entry)")
    print(f"load average at the end {load_average()}")


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
    parser.add_argument("--workers", type=int, default=None,
                        help="Chunks in flight (default: what neffcache picks for the tree's filesystem).")
    parser.add_argument("--layout", choices=("a", "b"), default="a",
                        help="a: libneuronxla's MODULE_ directories; b: TorchNeuron's sharded NEFF cache.")
    parser.add_argument("--cli", action=argparse.BooleanOptionalAction, default=True,
                        help="Also time `neffcache prune --yes` in its own process and report its peak RSS.")
    parser.add_argument("--index-rows", type=int, default=0, help="Index rows to plan over (0: skip).")
    parser.add_argument("--dir", type=Path, default=None, help="Scratch directory (default: a temp dir).")
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="neffcache-prune-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        if args.entries:
            bench_local(args.entries, args.rounds, args.workers, base, args.layout, args.cli)
        if args.index_rows:
            bench_index(args.index_rows, base)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
