"""``neffcache --version`` and ``doctor`` say whether scans list in C, and why not: the helper is
optional (pip goes on without a compiler), so a missing one was a silent slowdown. A helper that
was not built is made real in a subprocess by refusing its import (``sys.modules[name] = None``
raises ImportError exactly where a missing .so does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

MISSING = ("import sys; sys.modules['neffcache.stores._listdir'] = None; "
           "from neffcache.cli.main import main; sys.argv[0] = 'neffcache'; main()")
# An editable install built before the walker took its plan in band: a module whose Walker has
# no count_children (made real by a stand-in module in sys.modules).
OLDER = ("import sys, types; old = types.ModuleType('neffcache.stores._listdir'); "
         "old.Walker = type('Walker', (), {}); old.count_plain = None; "
         "sys.modules['neffcache.stores._listdir'] = old; "
         "from neffcache.cli.main import main; sys.argv[0] = 'neffcache'; main()")


def neffcache(*args: str, missing: bool = False, native: str | None = None, older: bool = False
              ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NEFFCACHE_NATIVE"}
    if native is not None:
        env["NEFFCACHE_NATIVE"] = native
    argv = ["-c", MISSING] if missing else ["-c", OLDER] if older else ["-m", "neffcache.cli.main"]
    return subprocess.run([sys.executable, *argv, *args], capture_output=True, text=True, env=env, timeout=120,
                          check=False)


def test_version_says_which_listing_runs_and_why_not() -> None:
    assert neffcache("--version").stdout.splitlines()[-1] == "native listing: active"
    assert neffcache("--version", native="0").stdout.splitlines()[-1] == "native listing: off (NEFFCACHE_NATIVE=0)"
    missing = neffcache("--version", missing=True)
    assert missing.returncode == 0, missing.stderr
    line = missing.stdout.splitlines()[-1]
    assert line.startswith("native listing: off (the C helper was not built: ") and "_listdir" in line
    older = neffcache("--version", older=True)
    assert older.returncode == 0, older.stderr
    assert older.stdout.splitlines()[-1] == ("native listing: off (the C helper is an older build "
                                             "(reinstall neffcache to rebuild it))")


def _native_finding(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    (finding,) = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "native listing"]
    return dict(finding)


def test_doctor_warns_when_the_helper_is_missing_not_when_turned_off() -> None:
    assert _native_finding(neffcache("doctor", "--json"))["level"] == "ok"
    off = _native_finding(neffcache("doctor", "--json", native="off"))
    assert off["level"] == "ok" and off["message"] == "off (NEFFCACHE_NATIVE=off)"
    missing = _native_finding(neffcache("doctor", "--json", missing=True))
    assert missing["level"] == "warning" and "the C helper was not built" in missing["message"]
    assert "gcc" in missing["fix"]
