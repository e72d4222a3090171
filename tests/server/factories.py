"""Builders of realistic entry records and events for the index tests."""

from __future__ import annotations

import time
import uuid
from typing import Any

from neffcache.server.services.identity import Writer

COMPILER = "2.27.5334.0+f702b353"
NAMESPACE = f"trn2-lnc2/neuronxcc-{COMPILER}"
TOOLCHAIN = {"compiler_version": COMPILER, "target": "trn2", "lnc": 2}
TOOLCHAIN_LABEL = NAMESPACE
WRITER = Writer("test-write")  # the identity a service call writes as (make_tokens' write token)


def module_key(i: int) -> str:
    return f"MODULE_{1000 + i}+abcd{i % 10000:04d}"


def entry(i: int = 0, **overrides: Any) -> dict[str, Any]:
    key = overrides.pop("key", module_key(i))
    namespace = overrides.pop("namespace", NAMESPACE)
    record: dict[str, Any] = {
        "path": f"{namespace}/{key}", "layout": "neuronxcc", "key": key, "namespace": namespace,
        "toolchain": TOOLCHAIN, "state": "SUCCESS", "size": 1_000_000 + i, "neff_sha256": "ab" * 32,
        "store": "s3://bucket/prefix", "tags": {"model": "llama3-8b", "team": "search", "bucket": "seq2048"},
        "created": time.time() - 3600, "producer": "warm-host-1", "compile_seconds": 120.0,
    }
    record.update(overrides)
    return record


def event(kind: str, **overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": uuid.uuid4().hex, "kind": kind, "ts": time.time(), "path": None, "key": None,
        "namespace": NAMESPACE, "toolchain": TOOLCHAIN, "job": "job-1", "model": "llama3-8b", "team": "search",
        "host": "trn-host-1", "instance_type": "trn2.48xlarge", "compile_seconds": None, "store": None,
        "message": None,
    }
    record.update(overrides)
    return record


def digest(i: int) -> str:
    """A distinct, valid sha256 hex digest per ``i`` (an HLO's, in these tests)."""
    return f"{i:064x}"
