"""`neffcache env --layout vllm`: the store is vLLM-Neuron's shared tier, a node-local directory
its local tier (never inside the store), and the settings that defeat its cache are named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from neffcache.cli.main import cli
from neffcache.stores import mounts
from tests.runtime_caches import VERSION

NS = f"trn2-lnc2/vllm-{VERSION}"
BASE = ["env", "--instance", "trn2.48xlarge", "--compiler-version", VERSION, "--layout", "vllm"]


def _env(*args: str, code: int = 0) -> dict[str, Any]:
    result = CliRunner().invoke(cli, [*BASE, *args, "--shell", "json"])
    assert result.exit_code == code, result.output
    data: dict[str, Any] = json.loads(result.output)
    return data


def test_the_store_is_the_shared_tier_and_the_local_tier_stays_off_it(tmp_path: Path) -> None:
    store, local = tmp_path / "fsx", tmp_path / "nvme"
    data = _env("--store", str(store), "--local", str(local))
    assert data["env"] == {"NEURON_LIBTORCH_REMOTE_CACHE": f"{store}/{NS}", "VLLM_CACHE_ROOT": f"{local}/{NS}",
                           "NEURON_LOGICAL_NC_CONFIG": "2"}
    notes = " ".join(data["notes"])
    assert f"neffcache push {local} {store}" in notes and "VLLM_NEURON_DISABLE_WARMUP_COMPILE=1" in notes
    # The default: the local_root setting (NEFFCACHE_LOCAL_ROOT; the suite points it into tmp).
    default = _env("--store", str(store))["env"]["VLLM_CACHE_ROOT"]
    assert default.endswith(f"node-local/{NS}") and not default.startswith(str(store))


def test_the_default_local_root_is_under_var_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NEFFCACHE_LOCAL_ROOT")
    assert _env("--store", str(tmp_path))["env"]["VLLM_CACHE_ROOT"] == f"/var/tmp/neffcache-local/{NS}"
    (tmp_path / "neffcache.toml").write_text(f'local_root = "{tmp_path}/from-file"\n')
    monkeypatch.chdir(tmp_path)
    assert _env("--store", str(tmp_path / "s"))["env"]["VLLM_CACHE_ROOT"] == f"{tmp_path}/from-file/{NS}"


def test_a_local_root_inside_the_store_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "fsx"
    for inside in (store, store / "vllm-local"):
        result = CliRunner().invoke(cli, [*BASE, "--store", str(store), "--local", str(inside)])
        assert result.exit_code != 0 and "inside the shared store" in str(result.exception), result.output
    # Another runtime's variables are printed without a node-local directory to refuse.
    other = CliRunner().invoke(cli, [*BASE[:-2], "--layout", "neuronxcc", "--store", str(store), "--local",
                                     str(store / "x")])
    assert other.exit_code == 0, other.output


def test_a_local_root_on_a_network_filesystem_is_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n50 22 0:40 / {tmp_path}/efs rw - nfs4 srv:/e rw\n")
    monkeypatch.setattr(mounts, "MOUNTINFO", info)
    (tmp_path / "efs").mkdir()
    notes = _env("--store", str(tmp_path / "fsx"), "--local", str(tmp_path / "efs" / "vllm"))["notes"]
    assert any("nfs4, a network filesystem" in n for n in notes)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "efs" / "v"))
    notes = _env("--store", str(tmp_path / "fsx"), "--local", str(tmp_path / "nvme"))["notes"]
    assert any("VLLM_CACHE_ROOT" in n and "file locks" in n for n in notes)


def test_s3_is_read_only_through_a_filesystem(tmp_path: Path) -> None:
    data = _env("--store", "s3://bucket/cache")
    assert set(data["env"]) == {"NEURON_LOGICAL_NC_CONFIG"}
    (note,) = data["notes"]
    assert "FSx for Lustre" in note and "neffcache pull" in note and "NEURON_LIBTORCH_REMOTE_CACHE" in note


def test_settings_that_defeat_vllms_cache_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_LIBTORCH_DISABLE_COMPILE_CACHE", "1")
    monkeypatch.setenv("VLLM_NEURON_CPU_COMPILE", "1")
    monkeypatch.setenv("VLLM_NEURON_CPU_MODE", "true")
    monkeypatch.setenv("NEURON_LIBTORCH_REMOTE_CACHE", "s3://bucket/x")
    notes = " ".join(_env("--store", str(tmp_path / "store"))["notes"])
    assert "turns vLLM-Neuron's compile cache off" in notes
    assert "cannot be set together" in notes and "is a URL" in notes
