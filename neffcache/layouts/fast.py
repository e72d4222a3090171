"""Making the objects a scan makes once per entry, without a frozen dataclass's ``__init__``.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``: ~2 us for an
``Entry``'s 12 fields, ~1 us for a ``Located``, paid per entry by every scan of 100k entries.
Setting the instance ``__dict__`` directly makes the same object (the same fields, in the same
order: equality, hashing, ``repr`` and ``dataclasses.replace`` see no difference) at a third of
the cost. tests/layouts/test_fast_objects.py compares them with the dataclasses' own.
"""

from __future__ import annotations

from neffcache.entry import Namespace
from neffcache.layouts.base import Located


def new_located(namespace: Namespace, key: str, path: str, base: str, name: str) -> Located:
    """``Located(namespace, key, path, base, name)``."""
    loc = object.__new__(Located)
    loc.__dict__.update(namespace=namespace, key=key, path=path, base=base, name=name)
    return loc
