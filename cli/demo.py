"""``neffcache demo``: the main job on the embedded default, end to end, in about a minute.

Every step is a real ``neffcache`` command run as its own process, printed before it runs, so
the demo doubles as a walk-through of the CLI: an index server in the background, a compile-only
warm-up over shape buckets, the same warm-up again (all hits), a plan of the job with a new
bucket (its forecast, the CI gate) and the warm-up that compiles only it, a wrapped "training job", a
compiler bump and re-warm, the job again on the new compiler (all hits), a prune of the old
compiler's entries (plan, then --yes), then the stats.

The steps are a list (:func:`steps`) so later features slot in where they belong.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from neffcache.errors import ConfigError
from neffcache.toolchain import find_compiler
from neffcache.warmers.report import WarmReport

from .errors import NOT_WARM
from .jobs import report_text
from .server import DEFAULT_PORT

INSTANCE = "trn2.48xlarge"
OLD_VERSION = "2.27.5334.0+f702b353"
NEW_VERSION = "2.28.1001.0+0badc0de"
BUCKETS = "128,256,512,1024"
NEW_BUCKET = "2048"
GRAPHS = 4
COMPILE_SECONDS = 1.0
WORKLOAD = [sys.executable, "-m", "neffcache.testing.workload", "--model", "llama-tiny", "--graphs", str(GRAPHS)]


# What the demo makes in its workdir, and the marker that says the directory is the demo's.
PARTS = ("cache", "server", "bin", "logs", "tmp", "spool", "server.log", "run-report.json")
MARKER = ".neffcache-demo"


def claim_workdir(workdir: Path) -> Path:
    """Make ``workdir`` the demo's and clear what an earlier demo made there; raise ConfigError,
    having changed nothing, when it holds anything the demo did not make.

    Why this never deletes a user's file: the demo removes only :data:`PARTS`, and only in a
    directory that carries :data:`MARKER`; the marker is written by this function alone, into a
    directory that did not exist or was empty, before the demo creates anything in it. A
    directory without the marker is used only when empty. (A fixed subfolder of the user's
    directory would not be enough: it could hold the user's files too, and would need the
    same check.)"""
    if workdir.exists() and not workdir.is_dir():
        raise ConfigError(f"--workdir {workdir} is a file, not a directory")
    marker = workdir / MARKER
    if marker.is_file():
        for part in PARTS:
            path = workdir / part
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        return workdir
    held = sorted(p.name for p in workdir.iterdir()) if workdir.is_dir() else []
    if held:
        shown = ", ".join(held[:6]) + (", ..." if len(held) > 6 else "")
        raise ConfigError(f"--workdir {workdir} holds files the demo did not make ({shown}): the demo deletes "
                          f"and rewrites what is in its workdir, so it runs only in a new or empty directory or "
                          f"one an earlier demo made (marked {MARKER}); nothing was changed. Name another "
                          f"directory, e.g. --workdir {workdir / 'neffcache-demo'}")
    workdir.mkdir(parents=True, exist_ok=True)
    marker.write_text("made by `neffcache demo`: it replaces these on its next run, and nothing else here:\n"
                      + "".join(f"{part}\n" for part in PARTS))
    return workdir


@dataclass
class Demo:
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    index_url: str | None = None
    compile_seconds: float = COMPILE_SECONDS
    failures: list[str] = field(default_factory=list)

    @property
    def store(self) -> str:
        return str(self.workdir / "cache")

    def neffcache(self, *args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
        """Run one real `neffcache` command, showing it first; ``capture`` keeps its stdout."""
        # `python` reads better in the printed command than the venv's full interpreter path.
        shown = ["python" if a == sys.executable else a for a in args]
        click.secho(f"$ neffcache {shlex.join(shown)}", fg="cyan")
        argv = [sys.executable, "-m", "neffcache.cli.main", *args]
        return subprocess.run(argv, env=self.env, stdout=subprocess.PIPE if capture else None, text=True,
                              check=False)

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)
            click.secho(f"  !! {what}", fg="red")

    def warm(self, *extra: str, buckets: str = BUCKETS) -> dict[str, Any]:
        proc = self.neffcache("warm", "--instance", INSTANCE, "--store", self.store, "--bucket", f"SEQ={buckets}",
                              "--parallel", "4", "--tag", "model=llama-tiny", "--tag", "team=demo", "--log-dir",
                              str(self.workdir / "logs"), "--json", *extra, "--", *WORKLOAD,
                              "--bucket", "{SEQ}", capture=True)
        if proc.returncode != 0 or not proc.stdout.strip():
            self.expect(False, f"warm exited {proc.returncode}")
            return {}
        report: dict[str, Any] = json.loads(proc.stdout)
        click.echo(_indent(report_text(WarmReport.from_json(report))))
        return report

    def train(self, label: str) -> dict[str, int]:
        report = self.workdir / "run-report.json"
        # A "training job": not compile-only, it runs its steps once its graphs are loaded.
        self.env.pop("TORCH_NEURONX_COMPILE_ONLY", None)
        shown = ["python" if a == sys.executable else a for a in WORKLOAD]
        click.secho(f"$ neffcache run --instance {INSTANCE} --store {self.store} --tag model=llama-tiny "
                    f"--tag team=demo -- {shlex.join(shown)} --bucket {BUCKETS} --steps 3", fg="cyan")
        argv = [sys.executable, "-m", "neffcache.cli.main", "run", "--instance", INSTANCE, "--store", self.store,
                "--tag", "model=llama-tiny", "--tag", "team=demo", "--report", str(report), "--", *WORKLOAD,
                "--bucket", BUCKETS, "--steps", "3"]
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, check=False)
        # The job's output passes through `neffcache run` unchanged; here it is shortened.
        click.echo(_indent(_abridged(proc.stderr + proc.stdout)))
        self.expect(proc.returncode == 0, f"{label}: the job exited {proc.returncode}")
        counts: dict[str, int] = json.loads(report.read_text()) if report.exists() else {}
        return counts


def _abridged(text: str, keep: int = 2) -> str:
    """Runs of similar runtime lines cut to their first ``keep``."""
    out: list[str] = []
    run: list[str] = []

    def flush() -> None:
        out.extend(run[:keep])
        if len(run) > keep:
            out.append(f"... ({len(run) - keep} more like it)")
        run.clear()

    for line in text.splitlines():
        kind = line.split("||: ", 1)[1][:20] if "||: " in line else None
        if run and kind is not None and kind == run[0].split("||: ", 1)[1][:20]:
            run.append(line)
            continue
        flush()
        if kind is not None:
            run.append(line)
        else:
            out.append(line)
    flush()
    return "\n".join(out)


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.rstrip().splitlines())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_available() -> bool:
    try:
        import uvicorn  # noqa: F401

        import neffcache.server.app  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def index_server(demo: Demo) -> Iterator[str | None]:
    """`neffcache serve` in the background on SQLite, for as long as the demo runs."""
    if not _server_available():
        click.echo("index server: the server extra is not installed (pip install 'neffcache[server]'); "
                   "the demo runs without an index")
        yield None
        return
    port = _free_port()
    token = secrets.token_urlsafe(24)
    env = {**demo.env, "NEFFCACHE_SERVER_ADMIN_TOKEN": token, "NEFFCACHE_SERVER_ANONYMOUS_READ": "1"}
    log = open(demo.workdir / "server.log", "wb")  # noqa: SIM115 - closed below
    argv = [sys.executable, "-m", "neffcache.cli.main", "serve", "--port", str(port), "--data-dir",
            str(demo.workdir / "server"), "--log-level", "warning"]
    click.secho(f"$ neffcache serve --port {port} --data-dir {demo.workdir / 'server'} &", fg="cyan")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=1) as reply:  # noqa: S310 - our own server
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                click.echo(f"index server did not start (see {demo.workdir / 'server.log'}); continuing without it")
                yield None
                return
            time.sleep(0.2)
        click.echo(f"  index (SQLite) at {url}")
        demo.env.update({"NEFFCACHE_INDEX_URL": url, "NEFFCACHE_TOKEN": token})
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def install_toolchain(demo: Demo, version: str) -> None:
    from neffcache.testing.shim import install_compiler_shim, simulated_env

    bin_dir = demo.workdir / "bin"
    install_compiler_shim(bin_dir, version=version, compile_seconds=demo.compile_seconds)
    if not demo.env:
        demo.env.update(simulated_env(bin_dir))


def plan_new_bucket(demo: Demo) -> None:
    """The gate a CI pipeline puts before a training job (exit 13 while anything would compile),
    then the warm-up that compiles only what the plan said was missing."""
    buckets = f"{BUCKETS},{NEW_BUCKET}"
    proc = demo.neffcache("plan", "--instance", INSTANCE, "--store", demo.store, "--bucket", f"SEQ={buckets}",
                          "--parallel", "4", "--require-warm", "--quiet", "--", *WORKLOAD, "--bucket", "{SEQ}")
    demo.expect(proc.returncode == NOT_WARM,
                f"plan --require-warm should exit {NOT_WARM} for the new bucket, not {proc.returncode}")
    totals = demo.warm("--quiet", buckets=buckets).get("totals", {})
    demo.expect(totals.get("compiled") == GRAPHS, "the warm-up after the plan should compile only the new bucket")


def steps(demo: Demo) -> list[tuple[str, Callable[[], None]]]:
    def warm_first() -> None:
        report = demo.warm()
        totals = report.get("totals", {})
        demo.expect(bool(report.get("ok")) and totals.get("compiled") == len(BUCKETS.split(",")) * GRAPHS,
                    "the first warm-up should compile every graph")

    def warm_again() -> None:
        totals = demo.warm("--quiet").get("totals", {})
        demo.expect(totals.get("compiled") == 0 and bool(totals.get("hits")),
                    "the second warm-up should be all hits")

    def train_old() -> None:
        counts = demo.train("training job")
        demo.expect(counts.get("compile") == 0 and bool(counts.get("hit")), "the training job should only hit")

    def bump_and_rewarm() -> None:
        install_toolchain(demo, NEW_VERSION)
        click.echo(f"  neuronx-cc on PATH is now {NEW_VERSION} (simulated upgrade): every old NEFF is stale")
        proc = demo.neffcache("rewarm", "--from-compiler", OLD_VERSION, "--store", demo.store, "--parallel", "4",
                              "--quiet")
        demo.expect(proc.returncode == 0, f"rewarm exited {proc.returncode}")

    def train_new() -> None:
        counts = demo.train("training job on the new compiler")
        demo.expect(counts.get("compile") == 0 and bool(counts.get("hit")),
                    "after the re-warm, the job on the new compiler should only hit")

    def prune_old() -> None:
        plan = demo.neffcache("prune", "--store", demo.store, "--keep-compiler", "current")
        demo.expect(plan.returncode == 0, f"the prune plan exited {plan.returncode}")
        done = demo.neffcache("prune", "--store", demo.store, "--keep-compiler", "current", "--yes")
        demo.expect(done.returncode == 0, f"prune --yes exited {done.returncode}")
        scan = demo.neffcache("scan", demo.store, "--json", capture=True)
        namespaces = [ns["path"] for ns in json.loads(scan.stdout or "{}").get("namespaces", [])]
        demo.expect(namespaces == [f"trn2-lnc2/neuronxcc-{NEW_VERSION}"],
                    f"after the prune only the new compiler's namespace should be left, not {namespaces}")

    def stats() -> None:
        demo.neffcache("scan", demo.store)
        if demo.index_url:
            demo.neffcache("stats", "--window", "1h", "--group-by", "model")

    n = len(BUCKETS.split(","))
    return [
        (f"warm: compile-only over {n} shape buckets, 4 at a time, on this CPU host", warm_first),
        ("warm again: everything is in the cache now", warm_again),
        (f"plan the job with a new bucket (SEQ={NEW_BUCKET}) before running it: what would compile, how long, "
         "and the CI gate; then warm compiles only that bucket", lambda: plan_new_bucket(demo)),
        ("a training job wrapped by `neffcache run`: hits counted from the runtime's own log lines", train_old),
        ("compiler upgrade: re-warm the stored HLOs with the new neuronx-cc", bump_and_rewarm),
        ("the training job again, on the new compiler", train_new),
        ("the old compiler's NEFFs are now dead weight: prune them (a plan first, then --yes)", prune_old),
        ("what the cache holds, and what the index saw", stats),
    ]


@click.command("demo")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path(".demo"),
              show_default=True, help="Where the demo keeps its cache, index and logs: a new or empty directory, "
                                      "or one an earlier demo made (it marks it with .neffcache-demo and replaces "
                                      "only what it made there).")
@click.option("--serve", is_flag=True, help="Keep the index server (and its dashboard) running at the end.")
@click.option("--compile-seconds", type=click.FloatRange(min=0), default=COMPILE_SECONDS, show_default=True,
              help="How long the simulated neuronx-cc takes per graph.")
def demo_cmd(workdir: Path, serve: bool, compile_seconds: float) -> None:
    """Run the main job on the embedded default and show the result (about a minute).

    Starts the index server (SQLite) in the background, warms a small model over several
    shape buckets in parallel, warms again (all hits), wraps a "training job" with
    `neffcache run`, bumps the compiler version and re-warms, runs the job again (all hits),
    prunes the old compiler's entries, and prints the stats and the dashboard URL. Uses a
    local store and the SIMULATED Neuron toolchain (neffcache.testing): fake NEFFs, real
    processes, real cache layouts.

    \b
    Example:
      neffcache demo --workdir /tmp/neffcache-demo --serve
    """
    workdir = claim_workdir(workdir.absolute())
    (workdir / "tmp").mkdir()
    started = time.monotonic()
    try:
        real = find_compiler()
        click.echo(f"note: {real} is a real neuronx-cc; the demo's workload is simulated (fake HLO), so it "
                   "uses the simulated compiler on its own PATH instead.")
    except FileNotFoundError:
        pass
    click.secho("neffcache demo: SIMULATED Neuron toolchain (neffcache.testing): a stand-in neuronx-cc "
                f"({compile_seconds:g}s per graph) and a compile-only torch-neuronx workload; fake NEFFs, real "
                "processes, real cache layouts.", bold=True)
    demo = Demo(workdir, compile_seconds=compile_seconds)
    install_toolchain(demo, OLD_VERSION)
    demo.env.update({"NEURON_RT_FAKE_INSTANCE_TYPE": INSTANCE, "TMPDIR": str(workdir / "tmp"),
                     "NEFFCACHE_SPOOL_DIR": str(workdir / "spool")})
    for name in ("NEFFCACHE_STORES", "NEFFCACHE_INDEX_URL", "NEFFCACHE_TOKEN", "NEURON_CC_FLAGS",
                 "NEURON_COMPILE_CACHE_URL", "TORCH_NEURONX_NEFF_CACHE_DIR", "NEFFSIM_FAIL_MATCH"):
        demo.env.pop(name, None)
    with index_server(demo) as url:
        demo.index_url = url
        for number, (title, step) in enumerate(steps(demo), 1):
            click.secho(f"\n== {number}. {title}", bold=True)
            step()
        click.echo("")
        click.echo(f"demo finished in {time.monotonic() - started:.0f}s; workdir {workdir}")
        if demo.failures:
            raise click.ClickException("demo checks failed: " + "; ".join(demo.failures))
        if url and serve:
            click.secho(f"dashboard: {url}/   (metrics: {url}/metrics)", bold=True)
            click.echo("serving the index until Ctrl-C ...")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
        elif url:
            click.secho(dashboard_hint(workdir), bold=True)


def dashboard_hint(workdir: Path) -> str:
    """How to see the dashboard once the demo's own server stopped: a server on the demo's
    database that lets reads in without a token (the demo's token died with it; on 127.0.0.1,
    serve's default interface, nothing else can reach it)."""
    command = shlex.join(["neffcache", "serve", "--data-dir", str(workdir / "server"), "--anonymous-read"])
    return (f"dashboard: the index stopped with the demo; browse it with: {command}   "
            f"(then open http://127.0.0.1:{DEFAULT_PORT}/), or rerun the demo with --serve")


COMMANDS: list[click.Command] = [demo_cmd]
