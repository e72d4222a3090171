"""Shared fixtures. Every test runs with HOME, XDG and temp dirs inside its own tmp_path."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# The store contract suite lives in the package (neffcache.testing.store_contract): pytest
# rewrites its asserts only if told before the first import.
pytest.register_assert_rewrite("neffcache.testing.store_contract")

from tests.simulation import Sim, make_sim  # noqa: E402


@pytest.fixture(autouse=True)
def _isolate_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("NEFFCACHE_SPOOL_DIR", str(home / "spool"))
    for var in list(os.environ):
        # A developer's own settings must not leak into tests.
        if var.startswith(("NEFFCACHE_", "NEURON_", "TORCH_NEURONX_", "NEFFSIM_", "VLLM_")) and var not in (
            "NEFFCACHE_SPOOL_DIR", "NEFFCACHE_REQUIRE_SERVICES", "NEFFCACHE_TEST_POSTGRES_URL",
            "NEFFCACHE_NATIVE",  # which listing a test run uses (tests/stores/test_listing_paths.py)
        ):
            monkeypatch.delenv(var, raising=False)
    # Node-local runtime tiers (vLLM's VLLM_CACHE_ROOT) default to /var/tmp: never in a test.
    # Beside tmp_path, not in it: a test may use tmp_path itself as the store, and `neffcache
    # env` refuses a node-local directory inside the store.
    monkeypatch.setenv("NEFFCACHE_LOCAL_ROOT", str(tmp_path.parent / f"{tmp_path.name}.node-local"))
    yield


@pytest.fixture
def sim(tmp_path: Path) -> Sim:
    """The simulated toolchain: a `neuronx-cc` shim on a private PATH, env scrubbed, paths isolated."""
    return make_sim(tmp_path)
