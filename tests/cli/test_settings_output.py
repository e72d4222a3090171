"""What the small commands print is what a user can take as it is: `config` prints TOML that
neffcache.toml takes back, `scan` without STORE scans the configured stores, counts read as
English ("1 entry", "2 entries") and durations in a unit that fits (never "0.00 hours")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a
from neffcache.units import compile_time, plural

CLI = [sys.executable, "-m", "neffcache.cli.main"]


def neffcache(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, **env})


def test_config_prints_toml_that_neffcache_toml_takes_back(tmp_path: Path) -> None:
    env = {"NEFFCACHE_STORES": "/nvme/cache,s3://bucket/prefix", "NEFFCACHE_TAGS": "team=llm,model=m",
           "NEFFCACHE_TOKEN": "nfc_secret", "NEFFCACHE_PARALLEL": "3"}
    shown = neffcache("config", **env)
    assert shown.returncode == 0, shown.stderr
    assert "nfc_secret" not in shown.stdout and "# token is set (not shown)" in shown.stdout
    assert "None" not in shown.stdout and "('" not in shown.stdout  # no Python reprs
    parsed = tomllib.loads(shown.stdout)
    assert parsed["stores"] == ["/nvme/cache", "s3://bucket/prefix"] and parsed["parallel"] == 3
    assert parsed["tags"] == {"team": "llm", "model": "m"} and "index_url" not in parsed
    # Written to a file, it gives the same settings.
    (tmp_path / "neffcache.toml").write_text(shown.stdout)
    again = json.loads(neffcache("config", "--json", NEFFCACHE_CONFIG=str(tmp_path / "neffcache.toml")).stdout)
    assert again["stores"] == parsed["stores"] and again["tags"] == parsed["tags"] and again["parallel"] == 3


def test_scan_without_store_scans_the_configured_stores(tmp_path: Path) -> None:
    a, b = LocalStore(tmp_path / "a"), LocalStore(tmp_path / "b")
    publish_a(a, key="MODULE_1+abb26765")
    stores = f"{a.root},{b.root}"
    text = neffcache("scan", NEFFCACHE_STORES=stores)
    assert text.returncode == 0, text.stderr
    assert f"{a.url}: 1 entry," in text.stdout and f"{b.url}: 0 entries," in text.stdout
    data = json.loads(neffcache("scan", "--json", NEFFCACHE_STORES=stores).stdout)
    assert [d["entries"] for d in data] == [1, 0]
    one = json.loads(neffcache("scan", str(a.root), "--json", NEFFCACHE_STORES=stores).stdout)
    assert isinstance(one, dict) and one["entries"] == 1  # one store named: its object, as before
    bare = neffcache("scan")
    assert bare.returncode == 2 and "name the store to scan" in bare.stderr


def test_counts_and_durations_read_as_english() -> None:
    assert [plural(n, "toolchain") for n in (0, 1, 2)] == ["0 toolchains", "1 toolchain", "2 toolchains"]
    assert (plural(1, "entry"), plural(2, "entry"), plural(2, "miss"), plural(1234, "hit")) == \
        ("1 entry", "2 entries", "2 misses", "1,234 hits")
    assert compile_time(3.2) == "3.2 s of compile time"
    assert compile_time(1800) == "30 min of compile time" and compile_time(5400) == "1.5 h of compile time"


def test_a_failures_window_the_index_would_refuse_is_a_usage_error() -> None:
    """`failures --window` is sent to the index too: checked by its pattern first (exit 2)."""
    for window in ("3x", "1.5d"):
        proc = neffcache("failures", "--window", window, NEFFCACHE_INDEX_URL="http://127.0.0.1:9")
        assert proc.returncode == 2, proc.stderr
        assert f"{window!r} is not a window" in proc.stderr and "Traceback" not in proc.stderr
