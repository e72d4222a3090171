"""Fixtures for the warmers: the `neffcache` CLI as a real subprocess over the simulated toolchain,
moto's S3 server and a live index server (SQLite), all on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from neffcache.entry import EntryState
from neffcache.scan.report import ScanReport, scan
from neffcache.server.config import ServerSettings
from neffcache.stores import open_store
from neffcache.testing.shim import install_compiler_shim
from tests.server.conftest import LiveServer, Tokens, make_tokens
from tests.simulation import Sim

INSTANCE = "trn2.48xlarge"
V1 = "2.27.5334.0+f702b353"
V2 = "2.28.1001.0+0badc0de"
WORKLOAD = (sys.executable, "-m", "neffcache.testing.workload")


@dataclass
class Cli:
    """Runs `neffcache` exactly as a user would: a new process, the simulated neuronx-cc on PATH."""

    sim: Sim
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "neffcache.cli.main", *args]

    def environ(self, **extra: str) -> dict[str, str]:
        return {**self.sim.env, **self.env, **extra}

    def run(self, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), env=self.environ(**env), capture_output=True, text=True,
                              timeout=timeout, check=False)

    def json(self, *args: str, rc: int = 0, **env: str) -> dict[str, Any]:
        split = args.index("--") if "--" in args else len(args)
        proc = self.run(*args[:split], "--json", *args[split:], **env)
        assert proc.returncode == rc, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"
        data: dict[str, Any] = json.loads(proc.stdout)
        return data

    def popen(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(*args), env=self.environ(**env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def bump(self, version: str) -> None:
        """A compiler upgrade: the same PATH now finds a neuronx-cc of ``version``."""
        install_compiler_shim(self.sim.bin_dir, version=version, invocation_log=self.sim.invocation_log)

    def workload(self, store: Path, *args: str, backend: str = "xla", version: str | None = None,
                 **env: str) -> subprocess.CompletedProcess[str]:
        """The simulated runtime on its own, pointed at ``store`` the way `neffcache env` says."""
        proc = self.run("env", "--instance", INSTANCE, "--store", str(store), "--shell", "json",
                        *(("--compiler-version", version) if version else ()))
        assert proc.returncode == 0, proc.stderr
        cache_env = json.loads(proc.stdout)["env"]
        return subprocess.run([*WORKLOAD, "--backend", backend, *args], env=self.environ(**cache_env, **env),
                              capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def cli(sim: Sim) -> Cli:
    return Cli(sim)


def warm_args(store: Path | str, *extra: str, buckets: str = "128,256", graphs: int = 2, backend: str = "xla",
              workload: tuple[str, ...] = ()) -> list[str]:
    return ["warm", "--instance", INSTANCE, "--store", str(store), "--bucket", f"SEQ={buckets}", "--quiet", *extra,
            "--", *WORKLOAD, "--model", "llama-tiny", "--bucket", "{SEQ}", "--graphs", str(graphs),
            "--backend", backend, *workload]


def summary(stderr: str) -> dict[str, int]:
    """The simulated workload's own count line."""
    line = [ln for ln in stderr.splitlines() if "graphs=" in ln][-1]
    return {k: int(v) for k, v in (part.split("=") for part in line.split(": ", 1)[1].split())}


def healthy(store: Path | str, **options: Any) -> ScanReport:
    """Scan and assert what every test needs: no half entry, no stale lock, no garbage."""
    report = scan(open_store(str(store), **options), read_manifests=True)
    bad = [(e.path, e.state.value, e.problems) for e in report.entries
           if e.state in (EntryState.CORRUPT, EntryState.LOCKED)]
    assert not bad, bad
    assert not report.uncommitted, [e.path for e in report.uncommitted]
    assert not report.garbage, [g.path for g in report.garbage]
    return report


def graphs_compiled(sim: Sim) -> list[str]:
    return [str(r["graph"]) for r in sim.compiles()]


@pytest.fixture
def s3(request: pytest.FixtureRequest, cli: Cli) -> Iterator[str]:
    """A bucket on moto's server; the CLI subprocesses find it through AWS_ENDPOINT_URL_S3."""
    endpoint = request.getfixturevalue("s3_endpoint")
    cli.env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": endpoint})
    yield "s3://neffcache-test/cache"


@dataclass
class Index:
    url: str
    tokens: Tokens
    server: LiveServer

    def stats(self) -> dict[str, Any]:
        with self.server.client(self.tokens.read) as client:
            data: dict[str, Any] = client.get("/v1/stats", params={"window": "1d"}).json()
        return data

    def entries(self, **filters: Any) -> list[dict[str, Any]]:
        with self.server.client(self.tokens.read) as client:
            body: dict[str, Any] = client.get("/v1/entries", params={"limit": 1000, **filters}).json()
        return list(body["entries"])


@pytest.fixture
def index(tmp_path: Path, cli: Cli) -> Iterator[Index]:
    """A live index server (SQLite) the CLI subprocesses report to."""
    settings = ServerSettings(data_dir=tmp_path / "index", database_url=f"sqlite:///{tmp_path / 'index.db'}",
                        token_cache_seconds=0.0)
    with LiveServer(settings) as live:
        tokens = make_tokens(live.db)
        cli.env.update({"NEFFCACHE_INDEX_URL": live.url, "NEFFCACHE_TOKEN": tokens.write})
        yield Index(live.url, tokens, live)


# Shared service fixtures, defined once in their own suites.
from tests.stores.conftest import aws_env, moto_server, s3_endpoint  # noqa: E402, F401
