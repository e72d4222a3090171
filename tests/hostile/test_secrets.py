"""No secret reaches a store (issue 41 N2): the action journal records the command line, and
a token on it (``--token``, a URL's password, ``?token=``) used to be written in clear into
``.neffcache/history/*.json``, group-writable on a shared mount, and printed by
``prune --history``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from neffcache.coordination.history import HISTORY_DIR
from neffcache.redaction import redact_argv, redact_text
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a
from tests.hostile.trees import json_of, neffcache

SECRET = "nfc_0a1b2c3d_Sup3rS3cretV4lue-QwErTy"
URL_PASSWORD = "hunter2pass"
QUERY_SECRET = "QuerySecretValue99"


def _every_byte(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink())


@pytest.mark.parametrize("shared", [False, True], ids=["local", "shared"])
def test_verify_fix_with_a_token_leaves_no_trace_of_it(tmp_path: Path, shared: bool) -> None:
    store = LocalStore(tmp_path / "c", shared=shared)
    good, _ = publish_a(store, key="MODULE_1+abb26765")
    bad, _ = publish_a(store, key="MODULE_2+abb26765")
    (store.root / bad / "model.neff").write_bytes(b"NEFF but not the bytes the manifest hashed")
    url = f"fsx://{store.root}" if shared else str(store.root)
    env = {"NEFFCACHE_SPOOL_DIR": str(tmp_path / "spool"), "NEFFCACHE_INDEX_URL": ""}
    result = neffcache("verify", url, "--fix", "--token", SECRET, "--json",
                       "--index-url", f"http://ci:{URL_PASSWORD}@127.0.0.1:9/?token={QUERY_SECRET}", env=env)
    assert [p.get("quarantined_to") is not None for p in json_of(result)["problems"]] == [True], result.stderr
    journals = list((store.root / HISTORY_DIR).glob("*.json"))
    assert len(journals) == 1
    command = json.loads(journals[0].read_bytes())["command"]
    assert "--token '***'" in command or "--token ***" in command, command
    everything = _every_byte(store.root)
    for secret in (SECRET.rsplit("_", maxsplit=1)[-1], URL_PASSWORD, QUERY_SECRET):
        assert secret.encode() not in everything, f"{secret} written to the store"
    # The journal is the store owner's: never group-writable, never world-readable.
    mode = stat.S_IMODE(journals[0].stat().st_mode)
    assert mode & (stat.S_IWGRP | stat.S_IRWXO) == 0, oct(mode)
    assert (store.root / good).is_dir()

    history = neffcache("prune", "--history", "--store", url)
    assert history.returncode == 0, history.stderr
    assert "verify" in history.stdout and SECRET.rsplit("_", maxsplit=1)[-1] not in history.stdout


def test_prune_history_redacts_records_written_before_redaction(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    publish_a(store)
    old = {"kind": "prune", "store": store.url, "why": "--max-size 1G", "at": 1_750_000_000.0, "id": "0123abcd",
           "who": "ci@build-3", "pid": 7, "part": 1, "parts": 1, "items": [], "counts": {},
           "command": f"neffcache prune --store s3://b/p --token {SECRET} --yes",
           "details": {"index": f"https://ops:{URL_PASSWORD}@idx.example/v1?access_token={QUERY_SECRET}"}}
    store.put_file(f"{HISTORY_DIR}/20250615T150640.000000Z-prune-0123abcd-1.json", json.dumps(old).encode())
    for form in ((), ("--json",)):
        shown = neffcache("prune", "--history", "--store", str(store.root), *form)
        assert shown.returncode == 0, shown.stderr
        assert "0123abcd" in shown.stdout or "ci@build-3" in shown.stdout, shown.stdout
        for secret in (SECRET.rsplit("_", maxsplit=1)[-1], URL_PASSWORD, QUERY_SECRET):
            assert secret not in shown.stdout + shown.stderr


@pytest.mark.parametrize(("given", "shown"), [
    (["neffcache", "push", "--token", "abc", "x"], ["neffcache", "push", "--token", "***", "x"]),
    (["neffcache", "--token=abc"], ["neffcache", "--token=***"]),
    (["warm", "--", "env", "NEFFCACHE_TOKEN=abc", "AWS_SECRET_ACCESS_KEY=k"],
     ["warm", "--", "env", "NEFFCACHE_TOKEN=***", "AWS_SECRET_ACCESS_KEY=***"]),
    (["pull", "s3://b/p", "--keep-compiler", "2.27"], ["pull", "s3://b/p", "--keep-compiler", "2.27"]),
    (["x", SECRET], ["x", "nfc_0a1b2c3d_***"]),
])
def test_redact_argv(given: list[str], shown: list[str]) -> None:
    assert redact_argv(given) == shown


def test_redact_text() -> None:
    text = ("GET https://u:pw@h/p?a=1&X-Amz-Signature=abc&token=t2 -H 'Authorization: Bearer eyJhbGciOi' "
            "--password=p1 secret=\"two words\"")
    assert redact_text(text) == ("GET https://u:***@h/p?a=1&X-Amz-Signature=***&token=*** -H 'Authorization: ***' "
                                 "--password=*** secret=***")
    assert redact_text("trn2-lnc2/neuronxcc-2.27/MODULE_1+abb26765") == "trn2-lnc2/neuronxcc-2.27/MODULE_1+abb26765"


def test_error_lines_and_log_records_print_no_password_or_token(tmp_path: Path) -> None:
    """An index URL with a password (or a token pasted into it) never reaches stderr: the CLI's
    error line and every log record go through the one redaction (issue 41's leftover)."""
    secret_url = "http://ci:hunter2@127.0.0.1:9/?token=nfc_ab12_s3cr3t"
    env = {**os.environ, "NEFFCACHE_INDEX_URL": secret_url, "NEFFCACHE_TOKEN": "nfc_ab12_s3cr3t",
           "NEFFCACHE_SPOOL_DIR": str(tmp_path / "spool")}
    for args in (["-vv", "stats"], ["-vv", "flush"]):
        done = subprocess.run([sys.executable, "-m", "neffcache.cli.main", *args], capture_output=True, text=True,
                              env=env, check=False, timeout=120)
        said = done.stdout + done.stderr
        assert "hunter2" not in said and "s3cr3t" not in said, said
        assert "127.0.0.1" in said  # the URL is still named, only its secrets are masked
