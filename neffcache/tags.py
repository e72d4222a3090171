"""Tags: the ``KEY=VALUE`` labels a user puts on entries and events (model, team, bucket...).

One home for what a tag may be. A tag travels from the command line (``--tag``) or the
settings (``tags``) into the manifest and to the index server, which refuses a registration
whose tags break its rules; a refused registration is set aside in the spool and the entry
never reaches the index (``neffcache/index/delivery.py``). So the CLI and the settings check
a tag with the same rules the server does (``server/services/records.py`` imports them from
here) and a mistake is an error at once, on the command that made it, instead of an entry the
fleet's dashboards never see.

The counts differ on purpose: a user gives at most :data:`MAX_USER_TAGS`, the index takes up to
:data:`MAX_INDEXED_TAGS` per entry, and the difference is room for the tags neffcache adds itself
(a warm-up's bucket keys, ``rewarmed_from``). Manifests read from a store are not held to these
rules (``neffcache/manifest.py`` has its own, looser bounds): an old or foreign entry stays
readable, only what neffcache is asked to write is checked here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

TAG_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
MAX_TAG_NAME = 64
MAX_TAG_VALUE = 256
MAX_USER_TAGS = 32
MAX_INDEXED_TAGS = 64
_NAME = re.compile(TAG_NAME_PATTERN)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def tag_problem(name: str, value: str) -> str | None:
    """Why ``name=value`` cannot be a tag, or None when it can."""
    if not name:
        return "a tag needs a name before '='"
    if len(name) > MAX_TAG_NAME:
        return f"tag name {name[:20]!r}... is longer than {MAX_TAG_NAME} characters"
    if not _NAME.match(name):
        return f"tag name {name!r} may only use letters, digits, '_', '.' and '-'"
    if len(value) > MAX_TAG_VALUE:
        return f"the value of tag {name!r} is longer than {MAX_TAG_VALUE} characters"
    if _CONTROL.search(value):
        return f"the value of tag {name!r} holds a control character"
    return None


def check_user_tags(tags: Mapping[str, str]) -> None:
    """Raise ValueError naming the first problem of tags a user gave (command line, settings)."""
    if len(tags) > MAX_USER_TAGS:
        raise ValueError(f"{len(tags)} tags given; at most {MAX_USER_TAGS}")
    for name, value in tags.items():
        problem = tag_problem(name, value)
        if problem is not None:
            raise ValueError(problem)
