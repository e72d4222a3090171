"""Scanning 10k to 1M entries of layout A and layout B vs a bare ``find`` of the same tree.

    .venv/bin/python -m bench.scan_bench --entries 100000
    .venv/bin/python -m bench.scan_bench --layout both --entries 10000,100000,1000000 \\
        --tree /work/tmp-scan/trees --rounds 2

Layout A is a libneuronxla cache (4 files per entry, one directory each); layout B TorchNeuron's
native cache (a NEFF per entry in 65,536 shard directories, an HLO for one in 4): see
bench/scan_tree.py, which makes both without writing a data block (sparse files of realistic
sizes). ``find -type f`` only lists names; ``find -printf '%P %s %T@'`` also stats every file,
as a scan must (sizes for the report, modification times for age): it is the fair baseline.
neffcache lists, stats and classifies every entry (state, size, namespace). All run on a warm
dentry cache (each round runs ``find`` first).

Measured per layout and size, best of ``--rounds``: the library's ``scan(store)`` (the full
report: every entry built) and ``summarize(store)`` (the totals the plain command prints, the
listing streamed) in this process, and as processes of their own, with their peak RSS (VmHWM,
recorded by the process itself: bench/common.py's HWM_LAUNCHER): the CLI's ``neffcache scan
ROOT`` (the plain summary), ``neffcache scan ROOT --json`` and ``neffcache scan ROOT --largest
10 --json`` (issue 39: a per-entry question at the plain scan's speed; its answer is checked
against the full scan's). The goal (issue 17) is a scan within 1.5x of ``find -printf``, its
cost linear in entries and its memory bounded; the last table gives microseconds and peak RSS
per entry at each size, so linearity reads down a column.

A scan pauses the cyclic garbage collector while it builds its objects; the collection it
defers runs at the next allocation after it returns. The "with deferred GC" figure adds a full
``gc.collect()`` right after each scan, so the saving is not just moved out of the timing.

``--tree DIR`` keeps the trees (``DIR/<layout>-<entries>/``) and reuses them on the next run: a
million layout-A entries is 5M inodes and takes many minutes to make (and to delete), so build
once, outside the benchmark lock, with ``--build-only``, then time them under the lock.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.common import VERSION, load_average, neffcache_measured, print_ratio
from bench.scan_tree import build_layout_a, build_layout_b
from neffcache.scan.report import scan
from neffcache.scan.sinks import Largest, sized
from neffcache.scan.summary import summarize
from neffcache.stores.local import LocalStore

GOAL = "(goal: <= 1.5x)"
LARGEST = 10  # `neffcache scan --largest 10 --json`: issue 39's question


def build(root: Path, entries: int, manifests: bool = False) -> None:
    """Layout A with real (tiny) contents: a manifest must match the files it lists."""
    ns = root / "trn2-lnc2" / f"neuronxcc-{VERSION}"
    ns.mkdir(parents=True)
    files = {"model.hlo_module.pb": b"h", "compile_flags.json": b"[]", "model.neff": b"n", "model.done": b""}
    for i in range(entries):
        entry = ns / f"MODULE_{i}+d41d8cd9"
        entry.mkdir()
        extra = {}
        if manifests:  # as neffcache publishes them: one neffcache.json per entry
            from neffcache.operations.ingest import build_manifest
            from neffcache.toolchain import Toolchain

            extra = {"neffcache.json": build_manifest("neuronxcc", f"MODULE_{i}+d41d8cd9", files,
                                                      toolchain=Toolchain(VERSION, "trn2", 2), flags=[],
                                                      tags={"model": "bench"}).to_bytes()}
        for name, data in (*files.items(), *extra.items()):
            fd = os.open(entry / name, os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, data)
            os.close(fd)


def build_tree(root: Path, layout: str, entries: int, manifests: bool) -> int:
    """Make the tree; returns the files in it."""
    if manifests:
        build(root, entries, manifests=True)
        return entries * 5
    made = build_layout_a(root, entries) if layout == "a" else build_layout_b(root, entries)
    return made.files


def inodes_needed(layout: str, entries: int) -> int:
    return entries * 5 if layout == "a" else entries * 5 // 4 + min(entries, 65_536) * 2 + 520


def check_room(parent: Path, layout: str, entries: int) -> None:
    free = os.statvfs(parent).f_favail
    need = inodes_needed(layout, entries)
    if free < need * 1.2:
        raise SystemExit(f"{parent}: {free} free inodes, a layout-{layout.upper()} tree of {entries} "
                         f"entries needs about {need}: choose another --tree or TMPDIR")


def remove_tree(path: Path) -> None:
    # rm -rf, not shutil.rmtree: at millions of files Python's per-file overhead adds minutes.
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)


@contextlib.contextmanager
def tree(layout: str, entries: int, manifests: bool, keep: Path | None) -> Iterator[Path]:
    """The cache root of a built tree: kept under ``keep`` (and reused if complete) or temporary."""
    home = (keep / f"{layout}-{entries}{'-manifests' if manifests else ''}" if keep
            else Path(tempfile.mkdtemp(prefix="neffcache-scan-")))
    stamp = home / "built.json"
    try:
        if stamp.exists():
            print(f"layout {layout.upper()}: reusing {home} ({stamp.read_text().strip()})", flush=True)
        else:
            if home.exists() and keep:
                remove_tree(home)  # an interrupted build
            home.mkdir(parents=True, exist_ok=True)
            check_room(home, layout, entries)
            started = time.perf_counter()
            files = build_tree(home / "cache", layout, entries, manifests)
            seconds = time.perf_counter() - started
            stamp.write_text(json.dumps({"entries": entries, "files": files, "build_seconds": round(seconds, 1)}))
            print(f"layout {layout.upper()}: built {entries} entries ({files} files) in {seconds:.1f}s "
                  f"({seconds / files * 1e6:.1f} us per file), load {load_average()}", flush=True)
        yield home / "cache"
    finally:
        if keep is None:
            remove_tree(home)


@dataclass
class Best:
    """Best (smallest) time of each measurement, and the largest peak RSS of each process."""

    seconds: dict[str, float]
    rss_kib: dict[str, int]

    def time(self, label: str, seconds: float) -> None:
        self.seconds[label] = min(self.seconds.get(label, seconds), seconds)

    def rss(self, label: str, kib: int) -> None:
        self.rss_kib[label] = max(self.rss_kib.get(label, kib), kib)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_shell(command: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command's processes)."""
    started, cpu = time.perf_counter(), children_cpu()
    subprocess.run(command, shell=True, check=True)
    return time.perf_counter() - started, children_cpu() - cpu


def run_cli(root: Path, args: list[str], entries: int, hwm: Path, largest: list[str] | None = None
            ) -> tuple[float, float, int]:
    """``neffcache scan ROOT *args`` as its own process: (seconds, CPU seconds, peak RSS in KiB);
    with ``--largest``, its answer checked against ``largest`` (the full scan's, by path)."""
    started, cpu = time.perf_counter(), children_cpu()
    done = subprocess.run(neffcache_measured(hwm, ["scan", str(root), *args]), capture_output=True, check=False)
    seconds, cpu = time.perf_counter() - started, children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"neffcache scan {' '.join(args)} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    if "--json" in args:
        got = json.loads(done.stdout)["entries"]
        assert got == entries, f"neffcache scan --json found {got} entries, not {entries}"
    if largest is not None:
        named = [e["path"] for e in json.loads(done.stdout)["largest"]]
        assert named == largest, f"neffcache scan --largest named {named[:3]}..., not {largest[:3]}..."
    return seconds, cpu, int(hwm.read_text())


def one_round(root: Path, store: LocalStore, entries: int, manifests: bool, cli: bool, best: Best,
              hwm: Path) -> None:
    for label, command in (("find", f"find {root} -type f | wc -l > /dev/null"),
                           ("find -printf", f"find {root} -type f -printf '%P %s %T@\\n' | wc -l > /dev/null")):
        seconds, cpu = timed_shell(command)
        best.time(label, seconds)
        best.time(f"{label} cpu", cpu)
    started, cpu = time.perf_counter(), time.process_time()
    report = scan(store)
    scanned, cpu = time.perf_counter(), time.process_time() - cpu
    gc.collect()
    best.time("scan", scanned - started)
    best.time("scan cpu", cpu)
    best.time("scan+gc", time.perf_counter() - started)
    assert len(report.entries) == entries, f"scan found {len(report.entries)} entries, not {entries}"
    top = Largest(LARGEST)
    top.add_all(sized(e) for e in report.entries)
    expected = [e.path for e in top.entries()]
    del report  # freed here, not inside the next measurement
    started, cpu = time.perf_counter(), time.process_time()
    summary = summarize(store)
    best.time("summary", time.perf_counter() - started)
    best.time("summary cpu", time.process_time() - cpu)
    assert summary.entries == entries, f"summarize found {summary.entries} entries, not {entries}"
    if manifests:
        started = time.perf_counter()
        report = scan(store, read_manifests=True)
        best.time("scan --manifests", time.perf_counter() - started)
        assert len(report.entries) == entries and not report.warnings, report.warnings[:3]
        del report
    if cli:
        for label, args in (("cli", []), ("cli --json", ["--json"]),
                            ("cli --largest", ["--largest", str(LARGEST), "--json"])):
            seconds, cpu, kib = run_cli(root, args, entries, hwm, expected if label == "cli --largest" else None)
            best.time(label, seconds)
            best.time(f"{label} cpu", cpu)
            best.rss(label, kib)
    print("  round: " + ", ".join(f"{k} {v:.2f}s" for k, v in best.seconds.items())
          + " (best so far)" + "".join(f", {k} peak RSS {v / 1024:.0f} MiB" for k, v in best.rss_kib.items()),
          flush=True)


def measure(layout: str, entries: int, args: argparse.Namespace) -> dict[str, object]:
    with tree(layout, entries, args.manifests, args.tree) as root:
        if args.build_only:
            return {}
        store = LocalStore(root, read_only=True, list_workers=args.list_workers)
        best = Best({}, {})
        with tempfile.TemporaryDirectory(prefix="neffcache-scan-hwm-") as tmp:
            for _ in range(args.rounds):
                one_round(root, store, entries, args.manifests, not args.no_cli, best, Path(tmp) / "hwm")
        report_ratios(layout, entries, best, store.list_workers)
        return {"layout": layout, "entries": entries, **best.seconds,
                **{f"{k} rss": v for k, v in best.rss_kib.items()}}


def report_ratios(layout: str, entries: int, best: Best, list_workers: int) -> None:
    s = best.seconds
    what = f"layout {layout.upper()}, scan of {entries} entries"
    print(f"{what}: list_workers={list_workers}")
    print_ratio(what, s["scan"], s["find"], "find -type f")
    print_ratio(what, s["scan"], s["find -printf"], "find -printf size+mtime (the same information)", GOAL)
    print_ratio(f"{what} with deferred GC", s["scan+gc"], s["find -printf"], "find -printf size+mtime", GOAL)
    # CPU seconds do not grow with the load of a shared machine as wall seconds do.
    print_ratio(f"{what}, CPU time", s["scan cpu"], s["find -printf cpu"], "find -printf's CPU time", GOAL)
    summary = f"layout {layout.upper()}, summary (what plain `neffcache scan` prints) of {entries} entries"
    print_ratio(summary, s["summary"], s["find -printf"], "find -printf size+mtime", GOAL)
    print_ratio(f"{summary}, CPU time", s["summary cpu"], s["find -printf cpu"], "find -printf's CPU time", GOAL)
    if "scan --manifests" in s:
        print_ratio(f"{what} reading every manifest", s["scan --manifests"], s["find -printf"], "find -printf")
        print_ratio(f"{what} reading every manifest", s["scan --manifests"], s["scan"], "the listing-only scan")
    for label in ("cli", "cli --json", "cli --largest"):
        if label in s:
            command = "`neffcache scan`" + {"cli": "", "cli --json": " --json",
                                            "cli --largest": f" --largest {LARGEST} --json"}[label]
            print_ratio(f"layout {layout.upper()}, {command} of {entries} entries", s[label], s["find -printf"],
                        "find -printf size+mtime",
                        f"{GOAL}; peak RSS {best.rss_kib[label] / 1024:.0f} MiB")
            print_ratio(f"layout {layout.upper()}, {command} of {entries} entries, CPU time", s[f"{label} cpu"],
                        s["find -printf cpu"], "find -printf's CPU time")


def print_table(rows: list[dict[str, object]]) -> None:
    """One line per layout and size: the ratios, and cost and memory per entry (linearity)."""
    print("\n| layout | entries | find -printf | scan | ratio | CPU ratio | summary | ratio | CPU ratio | CLI | ratio "
          "| CLI --json | ratio | peak RSS (--json) | us/entry (scan) | CPU us/entry | bytes/entry (RSS) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        s = {k: v for k, v in row.items() if isinstance(v, float)}
        n = int(str(row["entries"]))
        base = s["find -printf"]
        cli = s.get("cli", float("nan"))
        cli_json = s.get("cli --json", float("nan"))
        rss = int(str(row.get("cli --json rss", 0)))
        print(f"| {str(row['layout']).upper()} | {n:,} | {base:.2f} s | {s['scan']:.2f} s | {s['scan'] / base:.2f}x "
              f"| {s['scan cpu'] / s['find -printf cpu']:.2f}x "
              f"| {s['summary']:.2f} s | {s['summary'] / base:.2f}x | {s['summary cpu'] / s['find -printf cpu']:.2f}x "
              f"| {cli:.2f} s | {cli / base:.2f}x | {cli_json:.2f} s | {cli_json / base:.2f}x "
              f"| {rss / 1024:.0f} MiB | {s['scan'] / n * 1e6:.1f} | {s['scan cpu'] / n * 1e6:.1f} "
              f"| {rss * 1024 / n:.0f} |")


def parse_entries(text: str) -> list[int]:
    try:
        return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--entries takes counts such as 10000,100000, not {text!r}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=parse_entries, default=[100_000],
                        help="Entries per tree; a comma-separated list measures each size (default 100000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layout", choices=("a", "b", "both"), default="a",
                        help="a: libneuronxla's (4 files per entry); b: TorchNeuron's native (a NEFF per entry)")
    parser.add_argument("--manifests", action="store_true",
                        help="Give every entry a manifest (as neffcache publishes them, layout A, real contents); "
                             "the scan then reads each one to compare its file sizes, as `scan --manifests` does")
    parser.add_argument("--list-workers", type=int, default=None,
                        help="LocalStore listing threads (default: the store's own, 1 on a local disk)")
    parser.add_argument("--tree", type=Path, default=None,
                        help="Keep the trees under this directory and reuse them on the next run")
    parser.add_argument("--build-only", action="store_true", help="Make the trees (with --tree) and stop")
    parser.add_argument("--no-cli", action="store_true", help="Skip the `neffcache scan` processes")
    args = parser.parse_args()
    if args.build_only and args.tree is None:
        parser.error("--build-only needs --tree (else the trees are deleted as soon as they are made)")
    if args.manifests and args.layout != "a":
        parser.error("--manifests builds layout A only")
    print(f"load average at start: {load_average()}", flush=True)
    if shutil.which("find") is None:
        raise SystemExit("the baseline needs GNU find")
    rows = [measure(layout, entries, args) for layout in (("a", "b") if args.layout == "both" else (args.layout,))
            for entries in args.entries]
    if not args.build_only:
        print_table(rows)
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
