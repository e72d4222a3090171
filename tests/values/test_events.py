"""The event kinds: one enum for the index client and the server, whose values are the wire
strings the client sent and the server stored before it existed."""

from __future__ import annotations

import json

import pytest

from neffcache.events import EventKind
from neffcache.index.records import Event
from neffcache.server.services.records import EventIn


def test_the_kinds_are_the_wire_strings() -> None:
    assert [k.value for k in EventKind] == ["hit", "miss", "compile", "evict", "error"]
    assert all(k == k.value and str(k) == k.value for k in EventKind)


def test_an_event_sends_its_kind_as_the_string() -> None:
    event = Event(kind=EventKind.HIT, path="ns/MODULE_1/model.neff")
    assert json.loads(json.dumps(event.to_json()))["kind"] == "hit"


def test_an_event_given_a_string_holds_the_member() -> None:
    assert Event(kind="miss").kind is EventKind.MISS  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown event kind 'hits'"):
        Event(kind="hits")  # type: ignore[arg-type]


def test_the_server_reads_the_string_as_the_member() -> None:
    event = EventIn.model_validate_json('{"id": "abcdefgh", "kind": "evict", "ts": 1700000000.0}')
    assert event.kind is EventKind.EVICT
    assert json.loads(event.model_dump_json())["kind"] == "evict"
