"""The index client: reports never fail a cache operation; the spool delivers them exactly once."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from neffcache.errors import IndexServerError
from neffcache.index import IndexClient, NullIndex, open_index, spool_dir_for
from neffcache.server.services.tokens import create_token
from neffcache.server.storage.db import Database
from neffcache.toolchain import Toolchain
from tests.server.conftest import ServerProcess, Tokens, free_port, prepare_database
from tests.server.factories import COMPILER, entry

TOOLCHAIN = Toolchain(COMPILER, "trn2", 2)


@pytest.fixture
def later(tmp_path: Path) -> Iterator[tuple[str, str, Tokens]]:
    """An index URL nothing listens on yet, and its (prepared) SQLite database."""
    url = f"sqlite:///{tmp_path / 'index.db'}"
    yield f"http://127.0.0.1:{free_port()}", url, prepare_database(url)


def _stats(index_url: str, token: str) -> dict[str, int]:
    data = httpx.get(f"{index_url}/v1/stats", params={"window": "1d"},
                     headers={"Authorization": f"Bearer {token}"}).json()
    return {k: data["totals"][k] for k in ("hits", "misses", "compiles")}


def test_no_url_means_null_index() -> None:
    index = open_index()
    assert isinstance(index, NullIndex) and not index.enabled
    index.record("hit", key="k")
    index.register_entry(entry(1))
    assert index.lookup("x") is None
    with pytest.raises(IndexServerError, match="NEFFCACHE_INDEX_URL"):
        index.acquire("lease")


def test_index_down_then_back_delivers_everything_once(later: tuple[str, str, Tokens], tmp_path: Path) -> None:
    index_url, db_url, tokens = later
    client = open_index(index_url, tokens.write, batch_size=10, down_cooldown=60)
    assert isinstance(client, IndexClient)
    started = time.monotonic()
    client.register_entry(entry(1))
    for i in range(25):  # the cache operations these stand for must not fail or stall
        client.record("hit" if i % 2 else "miss", key=f"MODULE_{i}+abcd0000", toolchain=TOOLCHAIN, team="t")
    client.record("compile", key="MODULE_99+abcd0000", compile_seconds=12.5)
    client.close()
    assert time.monotonic() - started < 5
    spooled = list(spool_dir_for(index_url).glob("*.json"))
    assert len(spooled) >= 3
    with open_index(index_url, tokens.read, retries=0) as reader, pytest.raises(IndexServerError, match="unreachable"):
        reader.stats()

    server = ServerProcess(db_url, int(index_url.rsplit(":", 1)[1]), tmp_path / "server.log")
    try:
        server.wait_ready()
        back = open_index(index_url, tokens.write)
        assert isinstance(back, IndexClient)
        report = back.deliver()
        assert (report.delivered_events, report.delivered_entries, report.pending_batches) == (26, 1, 0)
        assert _stats(index_url, tokens.read) == {"hits": 12, "misses": 13, "compiles": 1}
        # A process that died after the server answered but before deleting its batch resends it.
        back.spool.put("events", [{"id": "resent-event-0001", "kind": "hit", "ts": time.time()}])
        back.spool.put("events", [{"id": "resent-event-0001", "kind": "hit", "ts": time.time()}])
        again = back.deliver()
        assert (again.delivered_events, again.duplicate_events) == (1, 1)
        assert _stats(index_url, tokens.read)["hits"] == 13
        assert back.lookup(entry(1)["path"])["stores"] == ["s3://bucket/prefix"]  # type: ignore[index]
        back.close()
    finally:
        server.stop()


def test_buffered_events_survive_the_process_exiting(later: tuple[str, str, Tokens], tmp_path: Path) -> None:
    index_url, db_url, tokens = later
    code = (
        "import sys; from neffcache.index import open_index\n"
        "ix = open_index(sys.argv[1], sys.argv[2], batch_size=1000, flush_interval=3600)\n"
        "for i in range(7): ix.record('miss', key=f'MODULE_{i}+abcd0000')\n"
        # no close(): the atexit hook must put the buffer on disk
    )
    subprocess.run([sys.executable, "-c", code, index_url, tokens.write], check=True, timeout=60)
    assert len(list(spool_dir_for(index_url).glob("*.events.json"))) == 1
    server = ServerProcess(db_url, int(index_url.rsplit(":", 1)[1]), tmp_path / "server.log")
    try:
        server.wait_ready()
        with open_index(index_url, tokens.write) as client:
            assert client.deliver().delivered_events == 7
        assert _stats(index_url, tokens.read)["misses"] == 7
    finally:
        server.stop()


def test_invalid_items_are_set_aside_and_the_rest_delivered(later: tuple[str, str, Tokens],
                                                           tmp_path: Path) -> None:
    index_url, db_url, tokens = later
    server = ServerProcess(db_url, int(index_url.rsplit(":", 1)[1]), tmp_path / "server.log")
    try:
        server.wait_ready()
        client = open_index(index_url, tokens.write)
        assert isinstance(client, IndexClient)
        client.record("hit", key="MODULE_1+abcd0000")
        client.record("hit", path="../../etc/passwd")  # the server refuses this one
        client.record("miss", key="MODULE_2+abcd0000")
        report = client.flush()
        assert (report.delivered_events, report.rejected, report.pending_batches) == (2, 1, 0)
        reasons = list(client.spool.rejected_dir.glob("*.reason.txt"))
        assert reasons and "path" in reasons[0].read_text()
        assert _stats(index_url, tokens.read) == {"hits": 1, "misses": 1, "compiles": 0}
        client.close()
    finally:
        server.stop()


def test_items_the_token_may_not_report_are_set_aside_not_kept(later: tuple[str, str, Tokens],
                                                              tmp_path: Path) -> None:
    """A 403 naming items (another team's, outside the token's prefixes) is no token problem:
    resending cannot change it, so those items are set aside and the spool keeps flowing."""
    index_url, db_url, tokens = later
    db = Database(db_url, pool_size=1)
    try:
        with db.write() as session:
            team_token = create_token(session, "team-b-ci", "write", team="team-b")[1]
    finally:
        db.dispose()
    server = ServerProcess(db_url, int(index_url.rsplit(":", 1)[1]), tmp_path / "server.log")
    try:
        server.wait_ready()
        client = open_index(index_url, team_token)
        assert isinstance(client, IndexClient)
        client.record("hit", key="MODULE_1+abcd0000", team="team-b")
        client.record("hit", key="MODULE_2+abcd0000", team="team-a")  # another team's: refused
        report = client.flush()
        assert (report.delivered_events, report.rejected, report.pending_batches) == (1, 1, 0)
        assert "team-b" in next(client.spool.rejected_dir.glob("*.reason.txt")).read_text()
        client.record("miss", key="MODULE_3+abcd0000")  # later reports are not held behind them
        assert client.flush().delivered_events == 1 and not client.counts().token_refused
        assert _stats(index_url, tokens.read) == {"hits": 1, "misses": 1, "compiles": 0}
        client.close()
    finally:
        server.stop()


def test_leases_and_questions_through_the_client(later: tuple[str, str, Tokens], tmp_path: Path) -> None:
    index_url, db_url, tokens = later
    with IndexClient(index_url, tokens.write, spool_dir=tmp_path / "s", retries=0) as down, \
            pytest.raises(IndexServerError):
        down.acquire("x")
    server = ServerProcess(db_url, int(index_url.rsplit(":", 1)[1]), tmp_path / "server.log")
    try:
        server.wait_ready()
        a = IndexClient(index_url, tokens.write, spool_dir=tmp_path / "a")
        b = IndexClient(index_url, tokens.write, spool_dir=tmp_path / "b")
        mine = a.acquire("graph/1", ttl=60)
        theirs = b.acquire("graph/1", ttl=60)
        assert mine.held and not theirs.held and theirs.holder == a.owner
        assert a.renew(mine, ttl=120).held
        assert not b.release(theirs)
        assert a.release(mine)
        assert b.acquire("graph/1").held
        a.register_entries([entry(i) for i in range(7)])
        a.flush()
        assert len(list(a.find_entries(page_size=3))) == 7
        assert a.forget(entry(0)["path"])["entry_removed"] is True  # type: ignore[index]
        assert a.lookup(entry(0)["path"]) is None
        assert a.stats(window="1d")["entries_by_state"]["SUCCESS"] == 6
        with IndexClient(index_url, tokens.read, spool_dir=tmp_path / "r") as reader, \
                pytest.raises(IndexServerError) as denied:
            reader.acquire("graph/2")
        assert denied.value.status == 403
        a.close()
        b.close()
    finally:
        server.stop()


def test_retries_on_503_then_succeeds(tmp_path: Path) -> None:
    answers = iter([httpx.Response(503, json={"detail": "busy"}), httpx.Response(200, json={"accepted": 1,
                                                                                            "duplicates": 0})])
    client = IndexClient("http://index.invalid", "t", spool_dir=tmp_path, backoff=0.01,
                         transport=httpx.MockTransport(lambda request: next(answers)))
    client.record("hit", key="k")
    assert client.flush().delivered_events == 1
    client.close()


def test_a_down_index_is_not_asked_again_during_the_cooldown(tmp_path: Path) -> None:
    calls = 0

    def refuse(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("refused", request=request)

    client = IndexClient("http://index.invalid", "t", spool_dir=tmp_path, retries=0, down_cooldown=60,
                         transport=httpx.MockTransport(refuse))
    client.record("hit", key="k")
    client.flush()
    client.record("miss", key="k")
    report = client.flush()
    assert calls == 1 and report.pending_batches == 2 and report.error
    client.close()


def test_recording_never_waits_for_a_slow_index(tmp_path: Path) -> None:
    import threading

    release = threading.Event()

    def slow(request: httpx.Request) -> httpx.Response:
        release.wait(10)
        return httpx.Response(200, json={"accepted": 1, "duplicates": 0})

    client = IndexClient("http://index.invalid", "t", spool_dir=tmp_path, batch_size=1,
                         transport=httpx.MockTransport(slow))
    client.record("hit", key="k")  # batch_size 1: this call starts a delivery...
    sender = threading.Thread(target=client.flush)
    sender.start()
    time.sleep(0.2)
    started = time.monotonic()
    for _ in range(20):  # ...and these, on another thread, must not queue behind it
        client.record("miss", key="k")
    assert time.monotonic() - started < 1.0
    release.set()
    sender.join()
    client.close()
    assert client.spool.pending() == []


def test_counts_say_what_was_spooled_sent_and_lost(tmp_path: Path) -> None:
    """A spool that cannot be written: reports go straight to the index while it answers, and
    what neither took is counted as lost, with the spool's error (never "registered")."""
    (tmp_path / "a-file").write_bytes(b"")
    up = {"on": True}

    def answer(request: httpx.Request) -> httpx.Response:
        if not up["on"]:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"registered": len(json.loads(request.content))})

    client = IndexClient("http://index.invalid", spool_dir=tmp_path / "a-file" / "spool", retries=0,
                         flush_interval=3600, transport=httpx.MockTransport(answer))
    client.register_entries([entry(i) for i in range(3)])
    client.flush()
    counts = client.counts()
    assert (counts.reported, counts.spooled, counts.sent_direct, counts.lost, counts.delivered) == (3, 0, 3, 0, 3)
    assert counts.spool_error and "a-file" in counts.spool_error
    up["on"] = False
    client.register_entries([entry(i) for i in range(3, 5)])
    client.close()
    counts = client.counts()
    assert (counts.reported, counts.sent_direct, counts.lost, counts.buffered) == (5, 3, 2, 0)

    healthy = IndexClient("http://index.invalid", spool_dir=tmp_path / "spool", retries=0, flush_interval=3600,
                          transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    healthy.register_entries([entry(i) for i in range(4)])
    healthy.close()
    assert (healthy.counts().spooled, healthy.counts().lost, healthy.counts().spool_error) == (4, 0, None)


def test_event_ids_are_unique_valid_and_in_the_order_they_were_made() -> None:
    """Time-ordered ids (new_event_id) keep the index's unique B-tree of event ids growing at its
    end; the server's EventId rule takes them."""
    from pydantic import TypeAdapter

    from neffcache.index.records import new_event_id
    from neffcache.server.services.records import EventId

    ids = [new_event_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    # In the order made (a wall clock stepped back by NTP mid-test may break it once or twice).
    assert sum(a < b for a, b in itertools.pairwise(ids)) >= len(ids) - 10
    check = TypeAdapter(EventId)
    assert all(check.validate_python(event_id) == event_id for event_id in ids[:100])
