"""What a user-given tag may be: one rule set for the CLI, the settings and the index server.

The argument: every tag set the CLI accepts is one the server's registration model accepts,
with room for the tags neffcache adds itself (a warm-up's bucket keys, rewarm's
``rewarmed_from``), so no entry is refused by the index after it was published."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neffcache.application.config import load_settings
from neffcache.errors import ConfigError
from neffcache.readiness import REWARMED_FROM_TAG
from neffcache.tags import MAX_TAG_NAME, MAX_TAG_VALUE, MAX_USER_TAGS, check_user_tags, tag_problem
from server.services.records import EntryIn
from tests.server.factories import entry


@pytest.mark.parametrize(("name", "value", "words"), [
    ("my team", "x", "letters, digits"),
    ("", "x", "needs a name"),
    ("team", "a\nb", "control character"),
    ("team", "a\x00", "control character"),
    ("n" * (MAX_TAG_NAME + 1), "x", "longer than"),
    ("team", "v" * (MAX_TAG_VALUE + 1), "longer than"),
    ("équipe", "x", "letters, digits"),
])
def test_bad_tags_are_named(name: str, value: str, words: str) -> None:
    problem = tag_problem(name, value)
    assert problem is not None and words in problem


def test_good_tags_pass() -> None:
    check_user_tags({"model": "llama3-8b", "team": "search ranking", "bucket.seq": "2048", "x_y-z": ""})
    with pytest.raises(ValueError, match=f"at most {MAX_USER_TAGS}"):
        check_user_tags({f"t{i}": "v" for i in range(MAX_USER_TAGS + 1)})


_names = st.from_regex(r"\A[A-Za-z0-9_.-]{1,64}\Z")
_values = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x7f",
                                min_codepoint=0x20), max_size=MAX_TAG_VALUE)


@given(st.dictionaries(_names, _values, max_size=MAX_USER_TAGS))
def test_what_a_user_may_give_the_index_accepts_with_neffcaches_own_tags(tags: dict[str, str]) -> None:
    check_user_tags(tags)
    # neffcache adds at most a bucket key per dimension and rewarm's tag on top of the user's.
    own = {**tags, **{f"bucket_dim{i}": "128" for i in range(8)}, REWARMED_FROM_TAG: "MODULE_1+abcd0001"}
    EntryIn.model_validate(entry(tags=own))


def test_the_cli_refuses_a_tag_the_index_would_refuse() -> None:
    proc = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "warm", "--instance", "trn2.48xlarge",
                           "--tag", "my team=search", "--", "true"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "'my team' may only use letters" in proc.stderr, proc.stderr


def test_settings_refuse_a_bad_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEFFCACHE_TAGS", "team=search,bad name=x")
    with pytest.raises(ConfigError, match="bad name"):
        load_settings()
