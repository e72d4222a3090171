"""Every deploy file against its schema or linter, offline: Kubernetes manifests with
kubernetes-validate (strict), the ServiceMonitor with its CRD fields, compose and CI files with
check-jsonschema's vendored schemas, Dockerfiles with hadolint."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.deploy import servicemonitor
from tests.deploy.files import CI, COMPOSE, DOCKER, k8s_documents, k8s_files

K8S_VERSION = servicemonitor.K8S_VERSION
BIN = Path(sys.executable).parent
DOCUMENTS = k8s_documents()


def _offline(argv: list[str]) -> list[str]:
    """Run without a network where the machine allows it (a new network namespace), so a
    schema that quietly reached for the web fails here instead of passing."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True, check=False).returncode == 0:
        return [unshare, "-n", *argv]
    return argv


def test_the_expected_manifests_exist() -> None:
    kinds = sorted({doc["kind"] for _, doc in DOCUMENTS})
    assert kinds == sorted(["Namespace", "Secret", "ServiceAccount", "Deployment", "Service", "PodDisruptionBudget",
                            "ServiceMonitor", "PersistentVolume", "PersistentVolumeClaim", "CronJob", "Job"])
    assert len(k8s_files()) >= 9


@pytest.mark.parametrize(("path", "doc"), DOCUMENTS,
                         ids=[f"{p.name}:{d['kind']}/{d['metadata']['name']}" for p, d in DOCUMENTS])
def test_k8s_manifest_is_valid(path: Path, doc: dict[str, Any]) -> None:
    if doc["apiVersion"] == "monitoring.coreos.com/v1":
        servicemonitor.validate(doc)
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_servicemonitor_schema_rejects_a_misspelt_field() -> None:
    doc = next(d for _, d in DOCUMENTS if d["kind"] == "ServiceMonitor")
    bad = {**doc, "spec": {**doc["spec"], "endpoints": [{**doc["spec"]["endpoints"][0], "bearerTokenSecrett": {}}]}}
    with pytest.raises(Exception, match="bearerTokenSecrett"):
        servicemonitor.validate(bad)


def test_strict_validation_rejects_a_misspelt_field() -> None:
    """The same check that passes the manifests fails one with a typo (so it is not vacuous)."""
    doc = next(d for _, d in DOCUMENTS if d["kind"] == "Deployment")
    bad = {**doc, "spec": {**doc["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


@pytest.mark.parametrize(("schema", "path", "extra"), [
    ("vendor.compose-spec", COMPOSE, []),
    ("vendor.github-workflows", CI / "github-actions.yml", []),
    ("vendor.gitlab-ci", CI / "gitlab-ci.yml", ["--data-transform", "gitlab-ci"]),
], ids=["compose", "github-actions", "gitlab-ci"])
def test_file_matches_its_vendored_schema(schema: str, path: Path, extra: list[str]) -> None:
    argv = _offline([str(BIN / "check-jsonschema"), "--builtin-schema", schema, *extra, str(path)])
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", sorted(DOCKER.glob("*.Dockerfile")), ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    result = subprocess.run([str(BIN / "hadolint"), str(dockerfile)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
