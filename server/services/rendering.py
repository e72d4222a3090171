"""An entry's API form kept as JSON text in its row, so a batch lookup answers from one column.

A batch of a thousand keys spent half its server time in the SELECT of each row with its
stores and tags aggregated, and most of the rest turning those rows into dicts and the dicts
into JSON (docs/index-server.md#performance). The server now writes each entry's JSON once,
when it registers or forgets it (services/catalog.py), and a batch lookup joins the stored
texts (services/lookups.py).

Why the bytes are the same as rendering the row: :func:`form` is ``orjson.dumps`` of the very
dict :func:`~.catalog.row_json` makes, less its last two keys, the usage stamps, and with its
closing brace left off; :func:`with_stamps` puts those two back from the row's own columns, so
the result is ``orjson.dumps(row_json(row))`` byte for byte (tests/server/test_rendered.py). The
stamps stay out of the stored text because every hit changes them. Whether a stored text is
still the entry's is the database's to guard (migration 0004); whether it is this server's
rendering is :data:`FORMAT`'s, which changes whenever the API form does.
"""

from __future__ import annotations

from typing import Any

import orjson

# The rendering this server writes and reads; another value (an older or newer server's) is
# answered from the row instead. Bump it with any change to the API form of an entry.
FORMAT = 1
STAMPS = ("hit_count", "last_used")  # the API form's last two keys, in that order


def form(entry: dict[str, Any]) -> bytes:
    """The stored text of ``entry`` (an API form, its stamps last): its JSON without them."""
    keys = list(entry)
    if tuple(keys[-2:]) != STAMPS:
        raise ValueError(f"an entry's API form ends with {STAMPS}, not {tuple(keys[-2:])}")
    return orjson.dumps({key: entry[key] for key in keys[:-2]})[:-1]


def with_stamps(stored: bytes, hit_count: int, last_used: float | None) -> bytes:
    """The entry's whole JSON: its stored text and its usage stamps as the row has them now."""
    return b'%b,"hit_count":%b,"last_used":%b}' % (stored, orjson.dumps(hit_count), orjson.dumps(last_used))
