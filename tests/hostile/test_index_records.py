"""Index records are claims, not facts (issue 41 N1): any write token can register a record for
an entry it does not own, in any store, with any size. A prune planned from the index checks
every candidate and every size against the store before it counts, so a forged record never
causes a deletion on its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from neffcache.index import IndexClient, open_index
from neffcache.index.records import entry_record
from neffcache.scan.report import load_entry, scan
from neffcache.server.services.tokens import create_token
from neffcache.stores.local import LocalStore
from tests.prune.helpers import OLD, published_a
from tests.server.conftest import LiveServer, Tokens, make_tokens

pytestmark = pytest.mark.slow
TEN_TIB = 10 * 2**40


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[LiveServer, Tokens]]:
    from neffcache.server.config import ServerSettings

    settings = ServerSettings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'index.db'}",
                              admin_token="admin-secret-for-hostile-tests", token_cache_seconds=0.0)
    with LiveServer(settings) as server:
        yield server, make_tokens(server.db)


def _client(server: LiveServer, token: str, spool: Path) -> IndexClient:
    client = open_index(server.url, token, spool_root=spool)
    assert isinstance(client, IndexClient)
    return client


def _prune(server: LiveServer, token: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NEFFCACHE_INDEX_URL": server.url, "NEFFCACHE_TOKEN": token,
           "NEFFCACHE_SPOOL_DIR": str(tmp_path / "spool-cli")}
    return subprocess.run([sys.executable, "-m", "neffcache.cli.main", "prune", *args], capture_output=True,
                          text=True, env=env, check=False, timeout=120)


def test_a_forged_ten_tib_record_deletes_nothing_real(live: tuple[LiveServer, Tokens], tmp_path: Path) -> None:
    server, tokens = live
    store = LocalStore(tmp_path / "c")
    real = [published_a(store, f"MODULE_{i}+abb26765") for i in range(1, 7)]
    owner = _client(server, tokens.write, tmp_path / "spool-owner")
    owner.register_entries([entry_record(e, store.url) for p in real if (e := load_entry(store, p))])
    assert owner.flush().error is None
    # Another write token (a warmer's, a CI job's) forges records: one for an entry the store does
    # not hold, one claiming a real entry is 10 TiB and of an obsolete compiler.
    with server.db.write() as session:
        _, other = create_token(session, "ci-job", "write")
    forger = _client(server, other, tmp_path / "spool-forger")
    template = entry_record(load_entry(store, real[0]), store.url)  # type: ignore[arg-type]
    ghost = {**template, "path": real[0].replace("MODULE_1", "MODULE_99"), "key": "MODULE_99+abb26765",
             "size": TEN_TIB, "created": 1e9}
    inflated = {**template, "path": real[1], "size": TEN_TIB, "created": 1e9,
                "toolchain": {"compiler_version": OLD, "target": "trn2", "lnc": 2}}
    forger.register_entries([ghost, inflated])
    flushed = forger.flush()
    # The server binds a record to the token that wrote it (issue 37): the claim on the owner's
    # entry is refused (403, set aside by the client); the ghost of an entry no one registered
    # lands. Prune must believe neither.
    assert flushed.error is None and flushed.rejected == 1 and flushed.delivered_entries == 1, flushed
    owner.close()
    forger.close()

    result = _prune(server, tokens.write, tmp_path, "--store", str(store.root), "--source", "index",
                    "--max-size", "1G", "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(e.path for e in scan(store).entries) == sorted(real), result.stdout
    assert "Traceback" not in result.stderr
    # The record the store does not back is named, not counted.
    assert "not in the store" in result.stdout + result.stderr, result.stdout


def test_reconcile_reports_odd_names_per_entry(live: tuple[LiveServer, Tokens], tmp_path: Path) -> None:
    """N10: an entry directory named ``MODULE_1 (copy)+…`` (or not UTF-8) is one entry reconcile
    cannot register; every other entry is registered (one odd record would get the batch refused)."""
    server, tokens = live
    store = LocalStore(tmp_path / "c")
    good = [published_a(store, f"MODULE_{i}+abb26765") for i in range(1, 4)]
    namespace = good[0].rsplit("/", 1)[0]
    shutil.copytree(store.root / good[0], store.root / namespace / "MODULE_1 (copy)+abb26765")
    shutil.copytree(os.fsencode(store.root / good[0]), os.fsencode(store.root / namespace) + b"/MODULE_\xff+abb26765")
    env = {**os.environ, "NEFFCACHE_INDEX_URL": server.url, "NEFFCACHE_TOKEN": tokens.write,
           "NEFFCACHE_SPOOL_DIR": str(tmp_path / "spool-cli")}
    done = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "reconcile", "--store", str(store.root),
                           "--yes", "--json"], capture_output=True, text=True, env=env, check=False, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stdout + done.stderr
    plan = json.loads(done.stdout)["plan"]
    assert sorted(m["path"] for m in plan["missing_in_index"]) == sorted(good)
    assert len(plan["unaddressable"]) == 2
    reader = _client(server, tokens.write, tmp_path / "spool-reader")
    assert all(reader.lookup(p) is not None for p in good)
    reader.close()
