"""deploy/security: the IAM and bucket-policy examples docs/security.md points at say what it says.

Read as a reviewer would: who may write which prefix. The policies are JSON with placeholders
(NEFF-CACHE-BUCKET, ACCOUNT-ID); these checks hold the statements to the branch-tier pattern.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parents[2] / "deploy" / "security"
BUCKET = "arn:aws:s3:::NEFF-CACHE-BUCKET"
WRITES = {"s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"}


def _policy(name: str) -> list[dict[str, Any]]:
    data = json.loads((HERE / name).read_text())
    assert data["Version"] == "2012-10-17"
    return list(data["Statement"])


def _as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _written(statements: list[dict[str, Any]]) -> set[str]:
    """The resources a role's Allow statements let it write."""
    return {r for s in statements if s["Effect"] == "Allow" and WRITES & set(_as_list(s["Action"]))
            for r in _as_list(s["Resource"])}


@pytest.mark.parametrize("name", ["iam-ci-main.json", "iam-ci-pr.json", "iam-job-read.json", "s3-bucket-policy.json"])
def test_every_statement_names_the_bucket(name: str) -> None:
    for statement in _policy(name):
        resources = _as_list(statement.get("Resource", statement.get("NotResource", [])))
        assert resources and all(r.startswith(BUCKET) for r in resources), statement


def test_only_main_ci_writes_main_and_pull_requests_write_their_own_tier() -> None:
    assert _written(_policy("iam-ci-main.json")) == {f"{BUCKET}/main/*"}
    assert _written(_policy("iam-ci-pr.json")) == {f"{BUCKET}/pr/${{aws:PrincipalTag/pr}}/*"}
    assert _written(_policy("iam-job-read.json")) == set()  # jobs read main, nothing more


def test_the_bucket_denies_main_to_everyone_but_main_ci() -> None:
    deny = [s for s in _policy("s3-bucket-policy.json") if s["Effect"] == "Deny" and s.get("Resource") ==
            f"{BUCKET}/main/*"]
    assert len(deny) == 1 and set(deny[0]["Action"]) >= WRITES
    assert deny[0]["Condition"]["ArnNotEquals"]["aws:PrincipalArn"].endswith(":role/neffcache-ci-main")


def test_the_fsx_setup_script_parses() -> None:
    proc = subprocess.run(["bash", "-n", str(HERE / "fsx-posix-groups.sh")], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
