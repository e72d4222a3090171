"""Retention of warm logs: each ``neffcache warm`` run keeps its buckets' workload output under
``<cache home>/warm-logs/<YYYYmmdd-HHMMSS>-<pid>/``; runs older than ``warm_log_days``
(default 14) are removed when the next ``warm`` starts and by ``prune --garbage``.

Only directories named as ``warm`` names its runs are ever removed, and never through a
symlink: a log directory given with ``--log-dir`` is the user's and is left alone.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from neffcache.application.config import default_cache_home

log = logging.getLogger(__name__)
RUN_NAME = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9]+$")


def warm_log_home() -> Path:
    return default_cache_home() / "warm-logs"


@dataclass(frozen=True)
class WarmLogRun:
    path: Path
    newest: float  # mtime of its newest file
    size: int


def _survey(run: Path) -> WarmLogRun:
    newest = run.lstat().st_mtime
    size = 0
    for top, dirs, files in os.walk(run):  # os.walk does not follow symlinked directories
        for name in files + dirs:
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            newest = max(newest, st.st_mtime)
            size += st.st_size if name in files else 0
    return WarmLogRun(run, newest, size)


def expired_runs(home: Path | None = None, days: float = 14.0, now: float | None = None) -> list[WarmLogRun]:
    """Warm runs under ``home`` whose newest file is older than ``days``."""
    home = warm_log_home() if home is None else home
    now = time.time() if now is None else now
    try:
        children = sorted(home.iterdir())
    except OSError:  # no warm ever ran here
        return []
    out = []
    for child in children:
        if not RUN_NAME.match(child.name) or child.is_symlink() or not child.is_dir():
            continue
        run = _survey(child)
        if now - run.newest > days * 86400:
            out.append(run)
    return out


def remove_runs(runs: list[WarmLogRun]) -> int:
    """Remove ``runs``; returns how many went (one that will not go is logged and left)."""
    gone = 0
    for run in runs:
        try:
            shutil.rmtree(run.path)
            gone += 1
        except OSError as exc:
            log.warning("cannot remove the warm log %s: %s", run.path, exc)
    return gone
