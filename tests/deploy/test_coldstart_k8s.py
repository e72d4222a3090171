"""deploy/k8s/coldstart: the serving Deployment (prefetch init container, write-back sidecar,
vLLM-Neuron behind its own must-be-warm gate) and the training Job (plan gate, `run --local`).

Checked three ways: strict Kubernetes schemas (kubernetes-validate, offline), what the manifests
wire together (volumes, the env file, the drain inside the grace period), and the containers'
own command lines run for real against local stand-ins for FSx and the node's NVMe, with the
simulated vLLM server and training workload in place of the real ones."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from neffcache.entry import EntryState
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from tests.deploy.commands import parse_invocation, replace_workload
from tests.deploy.conftest import local_argv
from tests.deploy.files import K8S
from tests.deploy.servicemonitor import K8S_VERSION
from tests.simulation import Sim

COLDSTART = K8S / "coldstart"
SERVER = [sys.executable, "-m", "neffcache.testing.vllm_server"]
WORKLOAD = [sys.executable, "-m", "neffcache.testing.workload", "--model", "llama3-8b", "--graphs", "2"]
SERVER_SHUTDOWN = 20  # seconds a vLLM server takes to stop once signalled (its grace allowance)


@cache
def documents() -> list[dict[str, Any]]:
    return [doc for path in sorted(COLDSTART.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def one(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in documents() if d["kind"] == kind]
    return doc


def pod(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def container(doc: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod(doc)
    (found,) = [c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == name]
    return found


def argv(c: dict[str, Any]) -> list[str]:
    return [*c["command"], *c.get("args", [])]


def option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def mount_of(doc: dict[str, Any], c: dict[str, Any], path: str) -> tuple[str, dict[str, Any]]:
    """(volume name, mount) of the mount ``path`` lies under in container ``c``."""
    for mount in c.get("volumeMounts", []):
        if path == mount["mountPath"] or path.startswith(mount["mountPath"] + "/"):
            return mount["name"], mount
    raise AssertionError(f"{c['name']}: nothing mounted at {path}")


def volume(doc: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [v for v in pod(doc)["volumes"] if v["name"] == name]
    return found


# ---------------------------------------------------------------------------------------------
# Static


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_is_valid_kubernetes(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_neffcache_command_parses() -> None:
    commands = [argv(c) for doc in documents() for c in [*pod(doc).get("initContainers", []), *pod(doc)["containers"]]
                if c["command"] == ["neffcache"]]
    assert {parse_invocation(a).name for a in commands} == {"prefetch", "push", "plan", "run"}


def test_serving_pod_wires_prefetch_sidecar_and_server_together() -> None:
    deploy = one("Deployment")
    prefetch, sidecar, server = (container(deploy, n) for n in ("neffcache-prefetch", "neffcache-write-back", "vllm"))
    fetch, push = parse_invocation(argv(prefetch)), parse_invocation(argv(sidecar))
    # Init order: the prefetch runs to completion, then the sidecar starts, then the server.
    assert [c["name"] for c in pod(deploy)["initContainers"]] == ["neffcache-prefetch", "neffcache-write-back"]
    assert sidecar["restartPolicy"] == "Always" and "restartPolicy" not in prefetch
    assert push.params["watch"] and fetch.params["best_effort"]
    local = fetch.params["local_root"]
    assert push.params["src_url"] == local
    names = {mount_of(deploy, c, local)[0] for c in (prefetch, sidecar, server)}
    assert len(names) == 1 and "emptyDir" in volume(deploy, names.pop())  # one node-local volume, no hostPath
    # The server sources the exports the prefetch wrote, from a volume they share.
    env_file = str(fetch.params["env_file"])
    script = server["args"][0]
    assert script.startswith(f". {env_file} && exec python3 -m vllm.entrypoints.openai.api_server")
    assert mount_of(deploy, prefetch, env_file)[0] == mount_of(deploy, server, env_file)[0]
    assert {e["name"]: e["value"] for e in server["env"]}["VLLM_NEURON_DISABLE_WARMUP_COMPILE"] == "1"
    # The shared store is the FSx mount, written by the sidecar only.
    shared = push.params["dst_url"].removeprefix("fsx://")
    assert fetch.params["store_urls"] == (push.params["dst_url"],)
    assert not mount_of(deploy, sidecar, shared)[1].get("readOnly")
    assert mount_of(deploy, prefetch, shared)[1].get("readOnly") and mount_of(deploy, server, shared)[1]["readOnly"]


def test_the_grace_period_fits_the_drain() -> None:
    deploy = one("Deployment")
    server = container(deploy, "vllm")
    drain = parse_invocation(argv(container(deploy, "neffcache-write-back"))).params["drain_timeout"]
    pre_stop = server["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre_stop + SERVER_SHUTDOWN + drain + 10 <= pod(deploy)["terminationGracePeriodSeconds"] <= 120
    job = one("Job")
    run = parse_invocation(argv(container(job, "train")))
    assert run.params["drain_timeout"] + 30 <= pod(job)["terminationGracePeriodSeconds"]


def test_training_job_gates_then_runs_against_the_local_tier() -> None:
    job = one("Job")
    gate, train = container(job, "neffcache-require-warm"), container(job, "train")
    plan, run = parse_invocation(argv(gate)), parse_invocation(argv(train))
    assert plan.params["require_warm"] and plan.params["stores"] == run.params["stores"]
    # Exit 13 (nothing warm) fails the Job at once instead of retrying.
    (rule,) = job["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [13]
    name, _ = mount_of(job, train, run.params["local_dir"])
    assert "emptyDir" in volume(job, name)
    assert not run.params["report_file"].is_relative_to(run.params["local_dir"])  # no stray file in the tier


# ---------------------------------------------------------------------------------------------
# Live


class Place:
    """The cluster's paths, mapped into one test's directory."""

    def __init__(self, tmp: Path) -> None:
        self.paths = {p: tmp / p.strip("/").replace("/", "-") for p in
                      ("/var/cache/neffcache-local", "/var/cache/neffcache", "/etc/neffcache", "/mnt/fsx")}
        for path in self.paths.values():
            path.mkdir(parents=True, exist_ok=True)

    def value(self, text: str) -> str:
        for cluster, local in sorted(self.paths.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(f"fsx://{cluster}", f"fsx://{local}")
            if text == cluster or text.startswith(cluster + "/"):
                return str(local) + text[len(cluster):]
        return text

    def argv(self, args: list[str]) -> list[str]:
        return [self.value(a) for a in args]

    def env(self, c: dict[str, Any]) -> dict[str, str]:
        return {e["name"]: self.value(e["value"]) for e in c.get("env", []) if "value" in e
                and not e["name"].startswith("NEFFCACHE_INDEX")}


def _server_command(place: Place, script: str, extra: list[str]) -> str:
    """The server container's script, the simulated server in vLLM's place (its arguments kept)."""
    source, _, rest = script.partition(" && exec ")
    words = shlex.split(rest)
    assert words[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    env_file = place.value(source.removeprefix(". "))
    return f". {env_file} && exec {shlex.join([*SERVER, *place.argv(words[3:]), *extra])}"


@pytest.mark.slow
def test_the_serving_pod_starts_warm_and_writes_back_what_it_compiles(sim: Sim, tmp_path: Path) -> None:
    deploy = one("Deployment")
    place = Place(tmp_path)
    fetch_argv = place.argv(argv(container(deploy, "neffcache-prefetch")))
    store = option(fetch_argv, "--store").removeprefix("fsx://")
    server = container(deploy, "vllm")
    script = server["args"][0]
    model_args = place.argv(shlex.split(script.partition(" && exec ")[2])[3:])
    base = {**sim.env, "NEFFSIM_VLLM_DEVICE": "trn2.48xlarge"}
    # Yesterday's warm-up filled FSx for this model (tagged as the prefetch selects it).
    warm = subprocess.run(local_argv(["neffcache", "warm", "--instance", "trn2.48xlarge", "--store", store,
                                      "--tag", "model=llama3-70b", "--quiet", "--", *SERVER, *model_args,
                                      "--bucket", "128", "--graphs", "2"]),
                          env=base, capture_output=True, text=True, timeout=180, check=False)
    assert warm.returncode == 0, warm.stderr
    fetched = subprocess.run(local_argv(fetch_argv), env={**base, **place.env(container(deploy, "neffcache-prefetch"))},
                             capture_output=True, text=True, timeout=120, check=False)
    assert fetched.returncode == 0, fetched.stderr
    sidecar_argv = place.argv(argv(container(deploy, "neffcache-write-back")))
    sidecar = subprocess.Popen(local_argv(sidecar_argv), env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        assert sidecar.stderr is not None
        while not sidecar.stderr.readline().startswith("watching "):
            assert sidecar.poll() is None
        gate = {**base, **place.env(server)}
        warm_start = subprocess.run(["sh", "-c", _server_command(place, script, ["--bucket", "128", "--graphs", "2",
                                                                                  "--exit-when-ready"])],
                                    env=gate, capture_output=True, text=True, timeout=120, check=False)
        assert warm_start.returncode == 0 and "compiled=0" in warm_start.stderr, warm_start.stderr
        # A new bucket without the gate: compiled on the node, written back by the sidecar.
        cold = subprocess.run(["sh", "-c", _server_command(place, script, ["--bucket", "512", "--graphs", "2",
                                                                            "--exit-when-ready"])],
                              env={**gate, "VLLM_NEURON_DISABLE_WARMUP_COMPILE": "0"}, capture_output=True,
                              text=True, timeout=120, check=False)
        assert cold.returncode == 0 and "compiled=2" in cold.stderr, cold.stderr
    finally:
        sidecar.send_signal(signal.SIGTERM)  # the server has exited: the kubelet stops the sidecar
        out, err = sidecar.communicate(timeout=120)
    assert sidecar.returncode == 0, err
    assert ": 2 published in " in out and "0 failures, drained: yes" in out, out
    shared = [e for e in scan(LocalStore(store)).entries if e.layout == "vllm"]
    assert len(shared) == 4 and all(e.state is EntryState.SUCCESS for e in shared)


@pytest.mark.slow
def test_the_training_job_is_gated_then_compiles_nothing(sim: Sim, tmp_path: Path) -> None:
    job = one("Job")
    place = Place(tmp_path)
    gate, train = container(job, "neffcache-require-warm"), container(job, "train")
    store = option(place.argv(argv(train)), "--store").removeprefix("fsx://")
    workload = [*WORKLOAD, "--bucket", "{SEQ}"]
    refused = subprocess.run(local_argv(replace_workload(place.argv(argv(gate)), workload)),
                             env={**sim.env, **place.env(gate)}, capture_output=True, text=True, timeout=180,
                             check=False)
    assert refused.returncode == 13, refused.stderr  # nothing warm yet: the Job fails at once
    seq = option(argv(gate), "--bucket")
    warm = subprocess.run(local_argv(["neffcache", "warm", "--instance", "trn2.48xlarge", "--store", store,
                                      "--bucket", seq, "--quiet", "--", *workload]),
                          env=sim.env, capture_output=True, text=True, timeout=180, check=False)
    assert warm.returncode == 0, warm.stderr
    passed = subprocess.run(local_argv(replace_workload(place.argv(argv(gate)), workload)),
                            env={**sim.env, **place.env(gate)}, capture_output=True, text=True, timeout=180,
                            check=False)
    assert passed.returncode == 0, passed.stderr
    before = len(sim.compiles())
    bucket = seq.split("=")[1]
    ran = subprocess.run(local_argv(replace_workload(place.argv(argv(train)), [*WORKLOAD, "--bucket", bucket])),
                         env={**sim.env, **place.env(train), "TORCH_NEURONX_COMPILE_ONLY": ""},
                         capture_output=True, text=True, timeout=180, check=False)
    assert ran.returncode == 0, ran.stderr
    report = json.loads(Path(place.value(option(argv(train), "--report"))).read_text())
    assert (report["prefetched"], report["hit"], report["compile"]) == (2, 2, 0), ran.stderr
    assert len(sim.compiles()) == before
    assert report["write_back"]["drained"] is True and report["write_back"]["published"] == 0
