"""deploy/k8s: the settings, ports, commands and flags are ones the code reads, checked by
parsing them and by running them: the Deployment's server on PostgreSQL with its probes, the
prune and fill CronJobs and a shard of the warm Job against local stand-ins for FSx and S3."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from tests.deploy.commands import Invocation, parse_invocation, replace_workload
from tests.deploy.conftest import local_argv, serve
from tests.deploy.files import (
    dockerfile_for,
    image_defaults,
    k8s_argv,
    k8s_kind,
    k8s_named,
    pod_spec,
    workloads,
)
from tests.deploy.settings import read_by_code, server_settings_from_env
from tests.simulation import make_sim

NAMESPACE = "neffcache"
WORKLOADS = workloads()
CONTAINERS = [(doc, c) for doc in WORKLOADS for c in pod_spec(doc)["containers"]]  # type: ignore[index]
IDS = [f"{doc['kind']}/{c['name']}" for doc, c in CONTAINERS]
_K8S_VAR = re.compile(r"\$\((\w+)\)")


def secret_value(name: str, key: str) -> str:
    secret = k8s_named("Secret", name)
    assert key in secret["stringData"], f"Secret {name} has no key {key}"
    value: str = secret["stringData"][key]
    return value


def field_ref_values(doc: dict[str, Any], path: str) -> list[str]:
    if path == "metadata.annotations['batch.kubernetes.io/job-completion-index']":
        assert doc["kind"] == "Job" and doc["spec"].get("completionMode") == "Indexed"
        return [str(i) for i in range(doc["spec"]["completions"])]
    raise AssertionError(f"no test values for fieldRef {path}")


def container_envs(doc: dict[str, Any], container: dict[str, Any],
                   secrets: dict[tuple[str, str], str] | None = None) -> list[dict[str, str]]:
    """The container's environment as the kubelet builds it, once per value of a fieldRef."""
    envs: list[dict[str, str]] = [{}]
    for item in container.get("env", []):
        source = item.get("valueFrom", {})
        if "value" in item:
            values = [item["value"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            values = [(secrets or {}).get((ref["name"], ref["key"])) or secret_value(ref["name"], ref["key"])]
        elif "fieldRef" in source:
            values = field_ref_values(doc, source["fieldRef"]["fieldPath"])
        else:
            raise AssertionError(f"unhandled env source {item}")
        envs = [{**env, item["name"]: v} for env in envs for v in values]
    return envs


def expand_k8s(argv: list[str], env: dict[str, str]) -> list[str]:
    """The kubelet's ``$(VAR)`` expansion: only variables declared in the container's env."""
    def repl(m: re.Match[str]) -> str:
        assert m.group(1) in env, f"$({m.group(1)}) is not declared in the container's env: left unexpanded"
        return env[m.group(1)]

    return [_K8S_VAR.sub(repl, a) for a in argv]


def invocations(doc: dict[str, Any], container: dict[str, Any]) -> list[Invocation]:
    return [parse_invocation(expand_k8s(k8s_argv(container), env)) for env in container_envs(doc, container)]


# ---------------------------------------------------------------------------------------------
# Static: what the manifests say matches what the code reads


@pytest.mark.parametrize(("doc", "container"), CONTAINERS, ids=IDS)
def test_container_command_is_a_real_neffcache_command(doc: dict[str, Any], container: dict[str, Any]) -> None:
    found = invocations(doc, container)
    assert found, "every container here runs neffcache"
    assert all(inv.path for inv in found)


@pytest.mark.parametrize(("doc", "container"), CONTAINERS, ids=IDS)
def test_container_env_names_are_read_by_the_code(doc: dict[str, Any], container: dict[str, Any]) -> None:
    referenced = {m for a in k8s_argv(container) for m in _K8S_VAR.findall(a)}
    for item in container.get("env", []):
        name = item["name"]
        assert name in referenced or read_by_code(name), f"{doc['kind']} sets {name}, which nothing reads"


@pytest.mark.parametrize(("doc", "container"), CONTAINERS, ids=IDS)
def test_pods_meet_the_restricted_pod_security_profile(doc: dict[str, Any], container: dict[str, Any]) -> None:
    """The namespace enforces `restricted`; a pod that breaks it would never start."""
    assert k8s_named("Namespace", NAMESPACE)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = pod_spec(doc)
    assert pod is not None
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["seccompProfile"]["type"] == "RuntimeDefault"
    ctx = container["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"]
    # The uid the pod asks for is the one the image was built with.
    source = dockerfile_for(container["image"])
    assert source is not None, f"no Dockerfile builds {container['image']}"
    assert image_defaults(source).user == f"{security['runAsUser']}:{security['runAsGroup']}"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_secret_references_resolve() -> None:
    for doc, container in CONTAINERS:
        for item in container.get("env", []):
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                secret_value(ref["name"], ref["key"])
                assert k8s_named("Secret", ref["name"])["metadata"]["namespace"] == doc["metadata"]["namespace"]
    monitor = k8s_kind("ServiceMonitor")[0]
    credentials = monitor["spec"]["endpoints"][0]["authorization"]["credentials"]
    secret_value(credentials["name"], credentials["key"])


def test_database_url_is_one_the_server_can_use() -> None:
    url = make_url(secret_value("neffcache-index", "database-url"))
    assert url.get_backend_name() == "postgresql"
    assert url.get_dialect().driver == "psycopg"  # the driver the [server] extra installs


def index_deployment() -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = k8s_named("Deployment", "neffcache-index")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return deployment, container


def test_index_deployment_settings() -> None:
    deployment, container = index_deployment()
    assert deployment["spec"]["replicas"] >= 2
    (serve_inv,) = invocations(deployment, container)
    assert serve_inv.path == ("serve",)
    port = serve_inv.params["port"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == port
    probes = {kind: container[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert all(p["port"] in (port, "http") for p in probes.values())
    (env,) = container_envs(deployment, container)
    settings = server_settings_from_env(env)
    assert settings.database_url and settings.database_url.startswith("postgresql")
    assert settings.admin_token is not None
    assert not settings.anonymous_read  # Prometheus scrapes with a read token (ServiceMonitor)
    # The image's healthcheck probes the port the manifests serve on.
    source = dockerfile_for(container["image"])
    assert source is not None
    assert f":{port}/healthz" in " ".join(image_defaults(source).healthcheck)
    assert port in image_defaults(source).expose


def test_service_and_servicemonitor_reach_the_pods() -> None:
    deployment, container = index_deployment()
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = k8s_named("Service", "neffcache-index")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] in [p["name"] for p in container["ports"]]
    monitor = k8s_kind("ServiceMonitor")[0]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service_port["name"]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    pdb = k8s_named("PodDisruptionBudget", "neffcache-index")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    # Every client's NEFFCACHE_INDEX_URL is this Service's cluster DNS name and port.
    expected = f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{service_port['port']}"
    for doc, c in CONTAINERS:
        for env in container_envs(doc, c):
            if "NEFFCACHE_INDEX_URL" in env:
                assert env["NEFFCACHE_INDEX_URL"] == expected


def test_indexed_warm_job_shards_cover_every_part_once() -> None:
    (job,) = k8s_kind("Job")
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["parallelism"] == job["spec"]["completions"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    found = invocations(job, container)
    assert {inv.path for inv in found} == {("warm",)}
    shards = sorted(inv.params["shard"] for inv in found)
    count = job["spec"]["completions"]
    assert shards == [f"{i}/{count}" for i in range(count)]
    assert found[0].params["instance"] == "trn2.48xlarge"


def test_fsx_volume_and_mounts() -> None:
    pv = k8s_named("PersistentVolume", "neffcache-fsx")
    assert pv["spec"]["csi"]["driver"] == "fsx.csi.aws.com"
    assert "flock" in pv["spec"]["mountOptions"]
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    pvc = k8s_named("PersistentVolumeClaim", "neffcache-fsx")
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pvc["spec"]["accessModes"] == pv["spec"]["accessModes"] == ["ReadWriteMany"]
    # Every fsx:// store a container names lives under a path where it mounts the claim.
    for doc, container in CONTAINERS:
        pod = pod_spec(doc)
        assert pod is not None
        claims = {v["name"] for v in pod.get("volumes", []) if v.get("persistentVolumeClaim", {}).get("claimName")
                  == pvc["metadata"]["name"]}
        mounts = [m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in claims]
        for arg in k8s_argv(container):
            if arg.startswith("fsx://"):
                path = arg.removeprefix("fsx://").split("=")[0]
                assert any(path.startswith(m + "/") for m in mounts), f"{doc['kind']}: {path} is not on the FSx mount"


def test_prune_cronjob_logs_the_plan_then_executes() -> None:
    cron = k8s_named("CronJob", "neffcache-prune")
    container = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    (inv,) = invocations(cron, container)
    assert inv.path == ("prune",)
    assert inv.params["yes"] and not inv.params["as_json"]  # the human-readable plan goes to the log
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert len(cron["spec"]["schedule"].split()) == 5


# ---------------------------------------------------------------------------------------------
# Live: the manifests' commands and environment, run for real


class Localizer:
    """Maps the cluster's paths, bucket and Service URL to this test's stand-ins."""

    def __init__(self, tmp: Path, bucket: str, index_url: str) -> None:
        self.paths = {"/mnt/fsx": tmp / "fsx", "/var/cache/neuron": tmp / "nvme",
                      "/var/cache/neffcache": tmp / "scratch"}
        for path in self.paths.values():
            path.mkdir(parents=True, exist_ok=True)
        self.bucket = bucket
        self.index_url = index_url

    def value(self, text: str) -> str:
        text = text.replace("s3://ml-neuron-cache/", f"s3://{self.bucket}/")
        text = re.sub(r"^http://neffcache-index\.neffcache\.svc:\d+", self.index_url, text)
        for cluster, local in self.paths.items():
            text = text.replace(f"fsx://{cluster}", f"fsx://{local}")
            if text == cluster or text.startswith(cluster + "/"):
                text = str(local) + text[len(cluster):]
        return text

    def argv(self, argv: list[str]) -> list[str]:
        return [self.value(a) for a in argv]

    def env(self, env: dict[str, str]) -> dict[str, str]:
        return {k: self.value(v) for k, v in env.items()}


def create_token(deploy_env: dict[str, str], name: str, scope: str) -> str:
    """`kubectl exec deploy/neffcache-index -- neffcache token create ...`, as the guide says."""
    result = subprocess.run(local_argv(["neffcache", "token", "create", name, "--scope", scope]),
                            env={**_base_env(), **deploy_env}, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _base_env() -> dict[str, str]:
    import os

    return dict(os.environ)


@pytest.mark.postgres
@pytest.mark.slow
def test_the_manifests_run_for_real(pg_url: str, tmp_path: Path, make_bucket: Callable[[], str],
                                    s3_env: dict[str, str]) -> None:
    deployment, container = index_deployment()
    secret = k8s_named("Secret", "neffcache-index")["stringData"]
    # The Secret's URL points at RDS; here the same settings point at the test PostgreSQL.
    (env,) = container_envs(deployment, container, {("neffcache-index", "database-url"): pg_url})
    assert env["NEFFCACHE_SERVER_ADMIN_TOKEN"] == secret["admin-token"]
    argv = expand_k8s(k8s_argv(container), env)
    with serve(argv, env, tmp_path) as server:
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert server.get(container[probe]["httpGet"]["path"]).status_code == 200, probe
        assert server.get("/readyz").json()["database"] == "postgresql"
        # /metrics needs a read token here (no anonymous reads): what the ServiceMonitor sends.
        assert server.get("/metrics").status_code == 401
        tokens = {key: create_token(env, key.removesuffix("-token"), scope) for key, scope in
                  (("writer-token", "write"), ("maintenance-token", "write"), ("prometheus-token", "read"))}
        assert server.get("/metrics", tokens["prometheus-token"]).status_code == 200
        client_secrets = {("neffcache-clients", key): value for key, value in tokens.items()}

        place = Localizer(tmp_path, make_bucket(), server.url)
        sim = make_sim(tmp_path / "sim")
        base = {**sim.env, **s3_env}
        results = {}
        for doc, c in CONTAINERS:
            if doc["kind"] == "Deployment":
                continue
            job_env = container_envs(doc, c, client_secrets)[0]
            cmd = expand_k8s(k8s_argv(c), job_env)
            # The user's training script is not here: the simulated workload stands in for it.
            cmd = replace_workload(cmd, [sys.executable, "-m", "neffcache.testing.workload", "--model", "llama3-8b",
                                         "--graphs", "2", "--bucket", "{SEQ}"])
            run = subprocess.run(local_argv(place.argv(cmd)), env={**base, **place.env(job_env)},
                                 capture_output=True, text=True, timeout=180, check=False)
            results[doc["metadata"]["name"]] = run
            assert run.returncode == 0, f"{doc['metadata']['name']}: {run.stdout}\n{run.stderr}"
        assert "prune plan" in results["neffcache-prune"].stdout
        # Shard 0 of 4 warmed one bucket into every tier and told the index.
        assert any((tmp_path / "fsx" / "neuron-cache").rglob("model.neff"))
        metrics = server.get("/metrics", tokens["prometheus-token"]).text
        assert re.search(r'^neffcache_entries\{[^}]*state="SUCCESS"[^}]*\} [1-9]', metrics, re.M), metrics
    # The server stopped on SIGTERM, as a rolling update stops it.
    with pytest.raises(httpx.TransportError):
        server.get("/healthz")
