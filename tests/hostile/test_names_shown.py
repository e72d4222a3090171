"""Names no encoding can print (N-low): a non-UTF-8 or control-character name in a store is shown
escaped (cli/output.py's shown_name), and never ends a command under a strict UTF-8 stdout."""

from __future__ import annotations

import os
from pathlib import Path

from neffcache.cli.output import shown_name
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a
from tests.hostile.trees import neffcache

STRICT = {"PYTHONIOENCODING": "utf-8:strict"}


def test_shown_name_escapes_what_a_terminal_or_an_encoder_cannot_take() -> None:
    assert shown_name("MODULE_1 (copy)+abb26765") == "MODULE_1 (copy)+abb26765"
    assert shown_name("MODULE_é+ab") == "MODULE_é+ab"
    assert shown_name(os.fsdecode(b"MODULE_\xff+ab")) == "MODULE_\\xff+ab"
    assert shown_name("a\tb\x1b[31m\x9b") == "a\\x09b\\x1b[31m\\x9b"
    assert shown_name("back\\slash") == "back\\\\slash"  # so "\\xff" printed is never ambiguous
    shown_name(os.fsdecode(bytes(range(1, 256)))).encode("utf-8", "strict")  # always encodable


def _odd_store(tmp_path: Path) -> tuple[LocalStore, str]:
    store = LocalStore(tmp_path / "c")
    path, _ = publish_a(store, key="MODULE_1+abb26765")
    ns = os.path.dirname(path).encode()
    odd = bytes(store.root) + b"/" + ns + b"/MODULE_\xff\x1b+abb26765"
    os.rename(bytes(store.root / path), odd)
    os.symlink("/etc", odd + b"/linked\xfe")  # and a warning naming a non-UTF-8 file
    return store, path


def test_scan_entries_under_a_strict_utf8_stdout(tmp_path: Path) -> None:
    store, _ = _odd_store(tmp_path)
    for args in (["--entries"], []):  # --manifests: odd entry names are issue 41 part A
        done = neffcache("scan", str(store.root), *args, env=STRICT)
        assert "Traceback" not in done.stderr and done.returncode == 1, done.stderr[-2000:]  # 1: it warned
        assert "MODULE_\\xff\\x1b+abb26765" in done.stdout + done.stderr
        assert "\x1b" not in done.stdout  # no escape sequence reaches the terminal
