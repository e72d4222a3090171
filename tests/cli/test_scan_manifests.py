"""What `scan` checks, as its help says: a plain scan judges entries by the listing; --manifests
also compares every file's size with the manifest (a mismatch is CORRUPT, exit 1) and shows
entries by tag and producer."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from neffcache.cli.main import cli
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a


def scan(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["scan", *args], catch_exceptions=False)
    return result.exit_code, result.output


def test_manifests_compares_sizes_and_shows_tags_and_producer(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cache")
    paths = [publish_a(store, key=f"MODULE_{i}+abb26765", producer=f"host{i % 2}")[0] for i in range(3)]
    with open(store.root / paths[0] / "model.neff", "ab") as fh:
        fh.write(b"grown")

    code, out = scan(str(store.root), "--manifests", "--entries", "--json")
    assert code == 1, out
    data = json.loads(out)
    assert data["states"]["CORRUPT"] == 1
    assert any("model.neff is" in w and "the manifest says" in w for w in data["warnings"])
    assert data["tags"] == {"model=llama": 3}
    assert data["producers"] == {"host0": 2, "host1": 1}
    listed = {e["path"]: e for e in data["entry_list"]}
    assert listed[paths[1]]["producer"] == "host1" and listed[paths[1]]["tags"] == {"model": "llama"}

    code, out = scan(str(store.root), "--manifests", "--entries")
    assert "producers: host0 (2), host1 (1)" in out and "tags: model=llama (3)" in out

    # A plain scan opens no file (the cost of `find`): its help says so, and what it reports.
    code, out = scan(str(store.root), "--json")
    assert code == 0 and json.loads(out)["states"]["CORRUPT"] == 0
    help_text = CliRunner().invoke(cli, ["scan", "--help"]).output
    assert "It opens no" in help_text and "compare each file's size" in help_text


def test_env_json_is_shell_json() -> None:
    args = ["env", "--instance", "trn2.48xlarge", "--compiler-version", "2.27.5334.0+f702b353", "--store", "/x"]
    a = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    b = CliRunner().invoke(cli, [*args, "--shell", "json"], catch_exceptions=False)
    assert a.exit_code == 0 and json.loads(a.output) == json.loads(b.output)
