"""The objects neffcache/layouts/fast.py (and Layout.entry_at) build without the dataclasses'
``__init__`` are the dataclasses' own objects in every way a caller can see."""

from __future__ import annotations

import dataclasses
import pickle

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.layouts.base import Layout, Located
from neffcache.layouts.fast import new_located

NS = Namespace("neuronxcc", "trn2-lnc2/neuronxcc-2.21.1.0+abc", "2.21.1.0+abc", "trn2", 2)


def test_new_located_is_a_located() -> None:
    fast = new_located(NS, "MODULE_1+ab", "p/MODULE_1+ab", "p/MODULE_1+ab", "model.neff")
    slow = Located(NS, "MODULE_1+ab", "p/MODULE_1+ab", "p/MODULE_1+ab", "model.neff")
    assert type(fast) is Located and fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert dataclasses.asdict(fast) == dataclasses.asdict(slow) and vars(fast) == vars(slow)
    assert list(vars(fast)) == [f.name for f in dataclasses.fields(Located)]
    assert dataclasses.replace(fast, name="x") == dataclasses.replace(slow, name="x")
    assert pickle.loads(pickle.dumps(fast)) == slow


def test_entry_at_is_an_entry() -> None:
    loc = Located(NS, "MODULE_1+ab", "p/MODULE_1+ab", "p/MODULE_1+ab", "")
    files = {"model.neff": FileInfo("p/MODULE_1+ab/model.neff", 4, 1.5)}
    fast = Layout.entry_at(loc, files, EntryState.SUCCESS, ["a problem"], None, manifest_name="m.json",
                           marker_name="model.done", committed=False, extra=("x",))
    slow = Entry(namespace=NS, key="MODULE_1+ab", path="p/MODULE_1+ab", base="p/MODULE_1+ab", files=dict(files),
                 state=EntryState.SUCCESS, problems=("a problem",), manifest=None, manifest_name="m.json",
                 marker_name="model.done", extra=("x",), committed=False)
    assert type(fast) is Entry and fast == slow and repr(fast) == repr(slow) and vars(fast) == vars(slow)
    assert list(vars(fast)) == [f.name for f in dataclasses.fields(Entry)]
    assert fast.files is not files  # its own copy, as before
    assert dataclasses.replace(fast, state=EntryState.CORRUPT) == dataclasses.replace(slow, state=EntryState.CORRUPT)
    assert pickle.loads(pickle.dumps(fast)) == slow and fast.size == 4
