"""Reading the files under deploy/: Kubernetes documents, the compose file, Dockerfiles, and
the command line each container really runs (image ENTRYPOINT/CMD overridden the way
Kubernetes and Compose override them)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DOCKER = DEPLOY / "docker"
COMPOSE = DEPLOY / "compose.yaml"
CI = DEPLOY / "ci"
GRAFANA_DASHBOARD = DEPLOY / "grafana" / "neffcache.json"
PROMETHEUS = DEPLOY / "prometheus"
OPERATIONS = ROOT / "docs" / "operations.md"

SERVER_DOCKERFILE = DOCKER / "server.Dockerfile"
WARMER_DOCKERFILE = DOCKER / "warmer.Dockerfile"
# Image names in the manifests -> the Dockerfile that builds them.
IMAGE_SOURCES = {
    "neffcache-server": SERVER_DOCKERFILE,
    "llama3-8b-warmer": WARMER_DOCKERFILE,
}


def k8s_files() -> list[Path]:
    return sorted(K8S.glob("*.yaml"))


@cache
def k8s_documents() -> list[tuple[Path, dict[str, Any]]]:
    """Parsed once per session; callers treat the documents as read-only."""
    docs = []
    for path in k8s_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path, doc))
    return docs


def k8s_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in k8s_documents() if doc["kind"] == kind]


def k8s_named(kind: str, name: str) -> dict[str, Any]:
    found = [doc for doc in k8s_kind(kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    kind = doc["kind"]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        spec: dict[str, Any] = doc["spec"]["template"]["spec"]
        return spec
    if kind == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return None


def workloads() -> list[dict[str, Any]]:
    return [doc for _, doc in k8s_documents() if pod_spec(doc) is not None]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


@dataclass(frozen=True)
class ImageDefaults:
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    expose: list[int] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)


def _instructions(path: Path) -> Iterator[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        yield word.upper(), rest.strip()


def image_defaults(dockerfile: Path) -> ImageDefaults:
    """ENTRYPOINT, CMD, ENV, USER, EXPOSE and HEALTHCHECK of the final stage (exec form only)."""
    stages: list[list[tuple[str, str]]] = []
    for word, rest in _instructions(dockerfile):
        if word == "FROM":
            stages.append([])
        elif stages:
            stages[-1].append((word, rest))
    entrypoint: list[str] = []
    cmd: list[str] = []
    env: dict[str, str] = {}
    user = None
    expose: list[int] = []
    healthcheck: list[str] = []
    for word, rest in stages[-1]:
        if word == "ENTRYPOINT":
            entrypoint = json.loads(rest)
            cmd = []  # a later ENTRYPOINT resets CMD, as Docker does
        elif word == "CMD":
            cmd = json.loads(rest)
        elif word == "ENV":
            for name, value in re.findall(r'(\w+)=("[^"]*"|\S+)', rest):
                env[name] = value.strip('"')
        elif word == "USER":
            user = rest
        elif word == "EXPOSE":
            expose += [int(p.split("/")[0]) for p in rest.split()]
        elif word == "HEALTHCHECK":
            healthcheck = json.loads(rest[rest.index("CMD") + 3:].strip())
    return ImageDefaults(entrypoint, cmd, env, user, expose, healthcheck)


def dockerfile_for(image: str) -> Path | None:
    name = image.rsplit("/", 1)[-1].split(":", 1)[0]
    return IMAGE_SOURCES.get(name)


def k8s_argv(container: dict[str, Any]) -> list[str]:
    """What the container runs: ``command`` replaces ENTRYPOINT (and drops CMD), ``args`` CMD."""
    source = dockerfile_for(container["image"])
    image = image_defaults(source) if source else ImageDefaults()
    if "command" in container:
        return [*container["command"], *container.get("args", [])]
    return [*image.entrypoint, *container.get("args", image.cmd)]


def compose_argv(service: dict[str, Any], dockerfile: Path) -> list[str]:
    """Compose: ``entrypoint`` replaces ENTRYPOINT (and drops CMD), ``command`` replaces CMD."""
    image = image_defaults(dockerfile)
    entrypoint = service.get("entrypoint", image.entrypoint)
    if isinstance(entrypoint, str):
        entrypoint = entrypoint.split()
    default_cmd = [] if "entrypoint" in service else image.cmd
    command = service.get("command", default_cmd)
    if isinstance(command, str):
        command = command.split()
    return [*entrypoint, *command]


_COMPOSE_VAR = re.compile(r"\$\{(?P<name>\w+)(?::?-(?P<default>[^}]*))?\}|\$(?P<bare>\w+)")


def compose_interpolate(value: str, environ: dict[str, str] | None = None) -> str:
    """Compose's interpolation with an empty shell environment: ``${X:-default}`` -> default."""
    environ = environ or {}
    if "$$" in value:
        raise AssertionError(f"$$ escapes are not handled here: {value!r}")

    def repl(m: re.Match[str]) -> str:
        name = m.group("name") or m.group("bare")
        if name in environ:
            return environ[name]
        if m.group("default") is None:
            raise AssertionError(f"${{{name}}} has no default in compose.yaml: `docker compose up` would warn")
        return m.group("default")

    return _COMPOSE_VAR.sub(repl, value)


def compose_environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: compose_interpolate(str(v)) for k, v in env.items()}


def compose_services_built_from(dockerfile: Path) -> dict[str, dict[str, Any]]:
    """Services whose image is built from ``dockerfile`` (directly, or by reusing its tag)."""
    services = compose()["services"]
    built = {name: s for name, s in services.items()
             if "build" in s and (COMPOSE.parent / s["build"]["context"] / s["build"]["dockerfile"]).resolve()
             == dockerfile.resolve()}
    tags = {s["image"] for s in built.values() if "image" in s}
    return {name: s for name, s in services.items() if name in built or s.get("image") in tags}


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    """Each stage's instructions (its FROM first), in order; line continuations joined."""
    found: list[list[tuple[str, str]]] = []
    for word, rest in _instructions(dockerfile):
        if word == "FROM":
            found.append([])
        if found:
            found[-1].append((word, rest))
    return found
