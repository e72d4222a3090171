"""Fixtures for the deploy suite: real servers started with the manifests' own command lines
and environment, moto's S3 on 127.0.0.1, and a fresh PostgreSQL schema per test."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
import pytest

from tests.services import fresh_postgres_schema
from tests.stores.moto_server import S3TestServer, start_server

NEFFCACHE = [sys.executable, "-m", "neffcache.cli.main"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def local_argv(argv: list[str]) -> list[str]:
    """``neffcache ...`` as this interpreter runs it (the venv's package, no PATH lookup)."""
    assert argv[0] == "neffcache", argv
    return [*NEFFCACHE, *argv[1:]]


def with_option(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value replaced (the flag must be there: we only rebind, never add)."""
    assert flag in argv, f"{flag} not in {argv}"
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


@dataclass
class RunningServer:
    url: str
    process: subprocess.Popen[str]
    log: Path

    def get(self, path: str, token: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(self.url + path, headers=headers, timeout=10)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def serve(argv: list[str], env: Mapping[str, str], workdir: Path) -> Iterator[RunningServer]:
    """Run a manifest's ``neffcache serve ...`` for real, rebound to a free port of 127.0.0.1."""
    port = free_port()
    argv = with_option(with_option(argv, "--host", "127.0.0.1"), "--port", str(port))
    log = workdir / f"serve-{port}.log"
    full_env = {**os.environ, **env}
    with log.open("w") as out:
        process = subprocess.Popen(local_argv(argv), env=full_env, stdout=out, stderr=subprocess.STDOUT, text=True,
                                   cwd=workdir, start_new_session=True)
    server = RunningServer(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"`{' '.join(argv)}` exited {process.returncode}:\n{server.output()}")
            try:
                if server.get("/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"`{' '.join(argv)}` never became ready:\n{server.output()}")
            time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # uvicorn stops its worker processes on SIGTERM
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL whose connections see only a fresh schema of the `test` database."""
    yield from fresh_postgres_schema("deploy")


@pytest.fixture(scope="session")
def moto() -> Iterator[S3TestServer]:
    server = start_server()
    yield server
    server.stop()


@pytest.fixture
def s3_env(moto: S3TestServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """AWS settings that reach moto; buckets are created by each test (as the manifests do)."""
    env = {"AWS_ENDPOINT_URL": moto.url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def make_bucket(s3_env: dict[str, str]) -> Callable[[], str]:
    def make() -> str:
        name = f"deploy-{uuid.uuid4().hex[:10]}"
        boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1").create_bucket(Bucket=name)
        return name

    return make


def clean_env(home: Path) -> dict[str, str]:
    """This process's environment without anyone's neffcache/Neuron/AWS settings, HOME in ``home``."""
    drop = ("NEFFCACHE_", "NEURON_", "TORCH_NEURONX_", "NEFFSIM_", "AWS_")
    keep = ("NEFFCACHE_REQUIRE_SERVICES", "NEFFCACHE_TEST_POSTGRES_URL")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) or k in keep}
    home.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_DATA_HOME=str(home / ".local" / "share"))
    return env


@dataclass
class ComposeStack:
    """deploy/compose.yaml's index, bucket job and warmer, run for real (SQLite in place of the
    postgres service, moto's server in place of the s3 service)."""

    server: RunningServer
    warm_runs: list[subprocess.CompletedProcess[str]]
    bucket_run: subprocess.CompletedProcess[str]
    workdir: Path
    upgrade_run: subprocess.CompletedProcess[str]  # `docker compose run upgrade`, after the warm runs

    def metrics(self) -> str:
        reply = self.server.get("/metrics")  # compose allows anonymous reads
        assert reply.status_code == 200, reply.text
        return reply.text


@pytest.fixture(scope="session")
def compose_stack(moto: S3TestServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeStack]:
    from tests.deploy.files import SERVER_DOCKERFILE, compose, compose_argv, compose_environment

    services = compose()["services"]
    workdir = tmp_path_factory.mktemp("compose")
    base = clean_env(workdir / "home")
    index = services["index"]
    env = compose_environment(index)
    # The postgres service is not here: the same settings with the embedded SQLite database.
    env["NEFFCACHE_SERVER_DATABASE_URL"] = f"sqlite:///{workdir / 'index.db'}"
    with serve(compose_argv(index, SERVER_DOCKERFILE), {**base, **env}, workdir) as server:
        port = compose_argv(index, SERVER_DOCKERFILE)
        port = port[port.index("--port") + 1]
        hosts = {f"http://index:{port}": server.url, "http://s3:5000": moto.url,
                 "/tmp/sim-bin": str(workdir / "sim-bin"), "/tmp/neuron-cache": str(workdir / "neuron-cache")}
        # Each `docker compose run` is a fresh container: its own /tmp.
        fresh = {**hosts, "/tmp/sim-bin": str(workdir / "upgrade" / "sim-bin"),
                 "/tmp/neuron-cache": str(workdir / "upgrade" / "neuron-cache")}

        def localize_for(table: dict[str, str], text: str) -> str:
            for cluster, local in table.items():
                text = text.replace(cluster, local)
            return text

        def localize(text: str) -> str:
            return localize_for(hosts, text)

        bucket_job = services["s3-bucket"]
        assert bucket_job["entrypoint"][:2] == ["python3", "-c"]
        bucket_run = subprocess.run([sys.executable, "-c", localize(bucket_job["entrypoint"][2])], env=base,
                                    capture_output=True, text=True, timeout=60, check=False)
        warmer = services["warmer"]
        argv = compose_argv(warmer, SERVER_DOCKERFILE)
        assert argv[:2] == ["/bin/sh", "-c"], argv
        warm_env = {**base, **{k: localize(v) for k, v in compose_environment(warmer).items()}}
        # The image's /opt/neffcache/bin is this venv's bin here (neffcache and python).
        warm_env["PATH"] = warm_env["PATH"].replace("/opt/neffcache/bin", str(Path(sys.executable).parent))
        # The simulated compiler's pretend compile time only makes the test slower; the shim
        # lets a caller's NEFFSIM_* value win over the one baked in by the compose command.
        warm_env["NEFFSIM_COMPILE_SECONDS"] = "0"
        runs = [subprocess.run(["/bin/sh", "-c", localize(argv[2])], env=warm_env, cwd=workdir, capture_output=True,
                               text=True, timeout=240, check=False) for _ in range(2)]
        upgrade = services["upgrade"]
        upgrade_env = {**base, **{k: localize_for(fresh, v) for k, v in compose_environment(upgrade).items()}}
        upgrade_env["PATH"] = upgrade_env["PATH"].replace("/opt/neffcache/bin", str(Path(sys.executable).parent))
        upgrade_argv = compose_argv(upgrade, SERVER_DOCKERFILE)
        upgrade_run = subprocess.run(["/bin/sh", "-c", localize_for(fresh, upgrade_argv[2])], env=upgrade_env,
                                     cwd=workdir, capture_output=True, text=True, timeout=240, check=False)
        yield ComposeStack(server, runs, bucket_run, workdir, upgrade_run)
