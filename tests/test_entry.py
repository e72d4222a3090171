"""Entry.listed (the scan's constructor) builds the instance Entry(...) builds."""

from __future__ import annotations

import dataclasses
import inspect

from neffcache.entry import Entry, EntryState, FileInfo, Namespace


def test_listed_is_the_dataclass_constructor() -> None:
    fields = [f.name for f in dataclasses.fields(Entry)]
    assert list(inspect.signature(Entry.listed).parameters) == fields  # every field, in order
    args = (Namespace("torchneuron", "torchneuron-2.9.0", "2.9.0"), "ab" * 16, "p", "b",
            {"x.neff": FileInfo("b/x.neff", 3, 1.0)}, EntryState.CORRUPT, ("why",), None, "m", "x.neff", ("e",), False)
    fast, slow = Entry.listed(*args), Entry(*args)
    assert fast == slow and vars(fast) == vars(slow) and type(fast) is Entry
    assert list(vars(fast)) == fields
    with_defaults = Entry(*args[:6])
    assert Entry.listed(*args[:6], (), None, "", "", (), True) == with_defaults
