"""SQLite writers queue for their turn across processes (server/storage/write_turn.py): a write
waits while another process holds the turn and goes ahead the moment it is released or its
holder is killed; a symlink planted where the lock file goes is never followed; a database
whose lock file cannot be opened still writes."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from neffcache.server.services import catalog
from neffcache.server.services.records import EntryIn
from neffcache.server.storage.db import Database, migrate
from neffcache.server.storage.models import Entry
from neffcache.server.storage.write_turn import WRITER_SUFFIX
from tests.server.factories import WRITER, entry

# Takes the turn on the lock file named in argv[1], says so, then holds it until stdin closes
# (or the process is killed).
_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'index.db'}", pool_size=2)
    migrate(database.engine)
    yield database
    database.dispose()


def _register(db: Database, i: int) -> None:
    record = EntryIn.model_validate(entry(i))
    db.transact(lambda s: catalog.register_entries(s, [record], time.time(), WRITER))


def _holder(lock: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(lock)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def _write_in_thread(db: Database, i: int) -> threading.Thread:
    thread = threading.Thread(target=_register, args=(db, i), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("release", ["exit", "kill"])
def test_a_write_waits_for_the_other_process_and_goes_ahead_when_its_turn_ends(
        db: Database, tmp_path: Path, release: str) -> None:
    holder = _holder(tmp_path / f"index.db{WRITER_SUFFIX}")
    try:
        writer = _write_in_thread(db, 1)
        writer.join(timeout=0.5)
        assert writer.is_alive(), "the write did not wait for the other process's turn"
    finally:
        if release == "kill":
            holder.kill()  # the kernel releases a dead holder's lock: no stale lock to clean up
        holder.communicate(timeout=30)  # closes its stdin (the "exit" case) and both pipes
    writer.join(timeout=30)
    assert not writer.is_alive()
    with db.read() as session:
        assert session.scalar(select(Entry.path)) == entry(1)["path"]


def test_a_planted_symlink_is_not_followed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    victim = tmp_path / "elsewhere" / "victim"
    victim.parent.mkdir()
    (tmp_path / f"index.db{WRITER_SUFFIX}").symlink_to(victim)
    caplog.set_level(logging.WARNING, logger="neffcache.server.storage.write_turn")
    database = Database(f"sqlite:///{tmp_path / 'index.db'}", pool_size=2)
    try:
        migrate(database.engine)
        _register(database, 1)
        _register(database, 2)
    finally:
        database.dispose()
    assert not victim.exists()  # neither created nor written through the link
    assert any("cannot open" in r.getMessage() for r in caplog.records)


def test_without_a_lock_file_writes_still_work(tmp_path: Path) -> None:
    # A lock file that cannot be opened (here a directory in its place, which even root cannot
    # open for writing): the writes queue on SQLite's busy handler alone, and still land.
    (tmp_path / f"index.db{WRITER_SUFFIX}").mkdir()
    database = Database(f"sqlite:///{tmp_path / 'index.db'}", pool_size=2)
    try:
        migrate(database.engine)
        _register(database, 1)
        _register(database, 2)
        with database.read() as session:
            assert len(session.scalars(select(Entry.id)).all()) == 2
    finally:
        database.dispose()
