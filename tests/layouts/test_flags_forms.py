"""neuronxcc flags forms (neffcache/layouts/flags.py) and deciding a namespace's form from its
own entries (neffcache/layouts/flags_form.py), against the real samples of docs/runtimes.md and
entries written by an independent writer (tests/runtime_caches.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest

from neffcache.entry import EntryState, Namespace
from neffcache.errors import FlagsFileError
from neffcache.layouts import flags_form, get_layout
from neffcache.layouts.flags import (
    FLAGS_JSON,
    FLAGS_TXT,
    JSON_STRING,
    LIST,
    TARGET,
    TEXT,
    adopted_form,
    flags_file,
    form_by_version,
    form_of_file,
    string_hashed_list,
    version_key,
)
from neffcache.layouts.flags_form import Rule, decide, evidence
from neffcache.manifest import FileDigest
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import publish
from neffcache.outcomes import PublishStatus
from neffcache.scan.report import scan
from neffcache.stores.base import FileSource
from neffcache.stores.local import LocalStore
from neffcache.toolchain import Toolchain
from tests.runtime_caches import ERA_BOTH, module_name, write_runtime_a

FLAGS = "--model-type=transformer"


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()[:8]


# -- the real samples (public cache trees on the Hugging Face Hub, aws-neuron-sdk issues) -------
@pytest.mark.parametrize(("form", "target", "flags", "name", "suffix"), [
    (TARGET, "trn1", [], FLAGS_JSON, "e30acd3a"),
    (TARGET, "trn1", ["--model-type=transformer"], FLAGS_JSON, "3cc9a3cb"),
    (TEXT, None, ["--model-type=transformer", "--auto-cast=none"], FLAGS_TXT, "2c2d707e"),
    (TEXT, None, ["--model-type=transformer"], FLAGS_TXT, "abb26765"),
    (TEXT, None, [], FLAGS_TXT, "d41d8cd9"),
    (LIST, None, ["--model-type=transformer", "--auto-cast=none"], FLAGS_JSON, "d7cde3b5"),
])
def test_the_real_samples(form: object, target: str | None, flags: list[str], name: str, suffix: str) -> None:
    assert form in (TEXT, LIST, TARGET)
    got_name, data = flags_file(form, target, flags)  # type: ignore[arg-type]
    assert (got_name, _md5(data)) == (name, suffix)
    assert adopted_form(f"MODULE_7+{suffix}", got_name, data) is form


def test_the_samples_are_the_plain_encodings() -> None:
    assert _md5(json.dumps(["--target=trn1"]).encode()) == "e30acd3a"
    assert _md5(json.dumps(["--target=trn1", "--model-type=transformer"]).encode()) == "3cc9a3cb"
    assert _md5(b"--model-type=transformer --auto-cast=none") == "2c2d707e"
    assert _md5(json.dumps(["--model-type=transformer", "--auto-cast=none"]).encode()) == "d7cde3b5"


# -- the version table ----------------------------------------------------------------------------
@pytest.mark.parametrize(("version", "form", "ambiguous"), [
    ("2.12.54.0+f631c2365", TEXT, False), ("2.13.99.0", TEXT, False),
    ("2.14.0.0", LIST, False), ("2.14.227.0+2d4f85be", LIST, True), ("2.14.227.1", LIST, False),
    ("2.15.128.0+56dc5a86", LIST, False), ("2.16.100.0", LIST, False), ("2.16.344.9+abc", LIST, False),
    ("2.16.345.0", TARGET, False), ("2.16.372.0+deadbeef", TARGET, False), ("2.21.33363.0+82129205", TARGET, False),
    ("3.0", TARGET, False),
])
def test_version_table_boundaries(version: str, form: object, ambiguous: bool) -> None:
    answer = form_by_version(version)
    assert answer is not None and answer.form is form and answer.ambiguous is ambiguous
    if ambiguous:
        assert answer.also_seen == (TEXT,)


def test_versions_compare_whole_and_ignore_the_hash() -> None:
    assert version_key("2.16.345.0+ffffffff") == (2, 16, 345, 0)
    assert version_key("2.16.100.0") < version_key("2.16.345.0") < version_key("2.16.372.0")  # type: ignore[operator]
    assert version_key("2.16") == (2, 16, 0, 0)
    assert version_key("garbage") is None and form_by_version("2.x.1") is None and version_key("2") is None


# -- reading a form off a file ---------------------------------------------------------------------
def test_forms_of_files_and_what_is_in_no_form() -> None:
    assert form_of_file(FLAGS_TXT, b"-O1 --lnc=2") is TEXT
    assert form_of_file(FLAGS_JSON, b'["-O1"]') is LIST and form_of_file(FLAGS_JSON, b"[]") is LIST
    assert form_of_file(FLAGS_JSON, b'["--target=trn2", "-O1"]') is TARGET
    assert form_of_file(FLAGS_JSON, b"--model-type=transformer") is JSON_STRING  # the 2.15.141.0 caller
    assert form_of_file(FLAGS_JSON, b"") is JSON_STRING
    for garbage in (b"{", b"[1]", b'{"a": 1}', b"\x00\x01\xff", b"plain words"):
        assert form_of_file(FLAGS_JSON, garbage) is None, garbage
    assert form_of_file(FLAGS_TXT, b"\xff\xfe") is None and form_of_file("other.json", b"[]") is None


def test_a_form_is_adopted_only_from_a_file_that_hashes_to_the_suffix() -> None:
    data = b"--model-type=transformer"
    assert adopted_form(f"MODULE_1+{_md5(data)}", FLAGS_JSON, data) is JSON_STRING
    assert adopted_form("MODULE_1+00000000", FLAGS_JSON, data) is None
    # A JSON list whose joined string is what the name hashes: reported, never adopted.
    listed = json.dumps(["--model-type=transformer", "-O1"]).encode()
    key = f"MODULE_1+{_md5(b'--model-type=transformer -O1')}"
    assert adopted_form(key, FLAGS_JSON, listed) is None and string_hashed_list(key, FLAGS_JSON, listed)
    assert not string_hashed_list(f"MODULE_1+{_md5(listed)}", FLAGS_JSON, listed)


# -- deciding a namespace's form ------------------------------------------------------------------
def _ns(root: Path, version: str = ERA_BOTH) -> Namespace:
    return Namespace("neuronxcc", f"neuronxcc-{version}", version)


def _entry(root: Path, i: int, form: str, mtime: float, version: str = ERA_BOTH) -> Path:
    entry = write_runtime_a(root, f"graph-{i}".encode(), version=version, flags=FLAGS, form=form)
    for f in entry.iterdir():
        os.utime(f, (mtime, mtime))
    return entry


def test_agreeing_entries_decide(tmp_path: Path) -> None:
    for i in range(3):
        _entry(tmp_path, i, "text", 1000 + i)
    got = decide([LocalStore(tmp_path)], _ns(tmp_path))
    assert got is not None and (got.form, got.rule) == ("text", Rule.ENTRIES)
    assert got.evidence.forms == {"text": 3} and got.evidence.read == 3
    assert "3 of 3 read agree" in got.explanation
    assert got.to_json()["rule"] == "entries" and got.to_json()["evidence"]["forms"] == {"text": 3}


def test_mixed_entries_the_newest_decides_and_the_disagreement_is_counted(tmp_path: Path) -> None:
    for i in range(3):
        _entry(tmp_path, i, "text", 1000 + i)  # SDK 2.19.0
    newest = _entry(tmp_path, 9, "list", 5000)  # then SDK 2.19.1, same compiler
    got = decide([LocalStore(tmp_path)], _ns(tmp_path))
    assert got is not None and (got.form, got.rule) == ("list", Rule.ENTRIES)
    assert got.evidence.forms == {"text": 3, "list": 1} and got.evidence.newest == newest.name
    assert "entries disagree (3 text, 1 list of 4 read)" in got.explanation


def test_entries_whose_flags_file_does_not_match_the_suffix_are_ignored(tmp_path: Path) -> None:
    _entry(tmp_path, 0, "text", 1000)
    edited = _entry(tmp_path, 1, "list", 9000)
    (edited / "compile_flags.json").write_text(json.dumps(["-O3"]))  # no longer what the name hashes
    os.utime(edited / "compile_flags.json", (9000, 9000))
    got = decide([LocalStore(tmp_path)], _ns(tmp_path))
    assert got is not None and (got.form, got.rule) == ("text", Rule.ENTRIES)
    assert got.evidence.mismatched == 1 and "1 whose flags file does not match the suffix" in got.explanation


def test_an_empty_namespace_takes_the_version_table_and_says_when_it_is_ambiguous(tmp_path: Path) -> None:
    got = decide([LocalStore(tmp_path)], _ns(tmp_path))
    assert got is not None and (got.form, got.rule, got.ambiguous) == ("list", Rule.TABLE, True)
    assert ("2.14.227.0 was shipped with both forms (text and list): warm one graph with the runtime first, "
            "or pass --flags-form") in got.explanation
    plain = decide([LocalStore(tmp_path)], _ns(tmp_path, "2.16.372.0+0badc0de"))
    assert plain is not None and (plain.form, plain.rule, plain.ambiguous) == ("target", Rule.TABLE, False)
    unknown = decide([LocalStore(tmp_path)], Namespace("neuronxcc", "x", None))
    assert unknown is not None and unknown.form is None and "--flags-form" in unknown.explanation


def test_the_override_wins_and_says_what_the_entries_said(tmp_path: Path) -> None:
    _entry(tmp_path, 0, "text", 1000)
    got = decide([LocalStore(tmp_path)], _ns(tmp_path), override="list")
    assert got is not None and (got.form, got.rule) == ("list", Rule.OVERRIDE)
    assert "entries said text" in got.explanation and any("overrides" in n for n in got.notes)
    with pytest.raises(FlagsFileError):
        decide([LocalStore(tmp_path)], _ns(tmp_path), override="json-string")


def test_the_first_tier_with_evidence_decides_and_another_tier_disagreeing_is_noted(tmp_path: Path) -> None:
    empty, text, listed = (tmp_path / n for n in ("empty", "text", "listed"))
    empty.mkdir()
    _entry(text, 0, "text", 1000)
    _entry(listed, 1, "list", 9000)
    got = decide([LocalStore(empty), LocalStore(text), LocalStore(listed)], _ns(tmp_path))
    assert got is not None and (got.form, got.evidence.store) == ("text", LocalStore(text).url)
    assert any(LocalStore(listed).url in n and "says list" in n for n in got.notes)


def test_other_layouts_have_no_form(tmp_path: Path) -> None:
    assert decide([LocalStore(tmp_path)], Namespace("torchneuron", "torchneuron-2.21.0.0", "2.21.0.0")) is None


def test_hostile_flags_files_are_no_evidence_and_no_crash(tmp_path: Path) -> None:
    root = tmp_path / "store"
    good = _entry(root, 0, "list", 1000)
    huge = _entry(root, 1, "text", 9001)
    (huge / "compile_flags.txt").write_bytes(b"-" * (flags_form.MAX_FLAGS_BYTES + 1))
    binary = _entry(root, 2, "list", 9002)
    (binary / "compile_flags.json").write_bytes(os.urandom(512))
    linked = _entry(root, 3, "text", 9003)
    outside = tmp_path / "outside.txt"  # what the name hashes, but outside the root: never followed
    outside.write_bytes((linked / "compile_flags.txt").read_bytes())
    (linked / "compile_flags.txt").unlink()
    (linked / "compile_flags.txt").symlink_to(outside)
    missing = _entry(root, 4, "list", 9004)
    (missing / "compile_flags.json").unlink()
    for d in (huge, binary, missing):
        for f in d.iterdir():
            os.utime(f, (9000, 9000))
    got = decide([LocalStore(root)], _ns(root))
    assert got is not None and (got.form, got.rule) == ("list", Rule.ENTRIES)
    assert got.evidence.newest == good.name and got.evidence.forms == {"list": 1}
    # huge and missing unreadable, binary no match; the out-of-root link's entry is not read at all.
    assert (got.evidence.read, got.evidence.unreadable, got.evidence.mismatched) == (4, 2, 1)


def test_the_listing_and_the_reads_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(12):
        _entry(tmp_path, i, "list", 1000 + i)
    monkeypatch.setattr(flags_form, "LISTED", 5)
    monkeypatch.setattr(flags_form, "SAMPLE", 3)
    store = LocalStore(tmp_path)
    assert len(flags_form.listed_entries(store, _ns(tmp_path))) == 5
    found = evidence(store, _ns(tmp_path))
    assert found.read == 3 and found.forms == {"list": 3}


# -- writing into a text-form namespace ---------------------------------------------------------
class RecordingStore(LocalStore):
    """A local store that remembers the order files were made visible in."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.order: list[str] = []

    def put_file(self, path: str, source: FileSource, *, exclusive: bool = False, move: bool = False,
                 expect: FileDigest | None = None) -> bool:
        done = super().put_file(path, source, exclusive=exclusive, move=move, expect=expect)
        self.order.append(path.rpartition("/")[2])
        return done


def test_a_publish_into_a_text_form_namespace_commits_with_the_neff_written_last(tmp_path: Path) -> None:
    layout = get_layout("neuronxcc")
    tc = Toolchain(ERA_BOTH, "trn2", 2)
    ns = dataclasses.replace(layout.namespace_for(tc), flags_form="text")
    name, data = layout.flags_file(ns, "", [FLAGS])
    key = f"MODULE_42+{_md5(data)}"
    files: dict[str, FileSource] = {"model.hlo_module.pb": b"HloModule m", name: data, "model.neff": b"NEFF" * 64}
    manifest = build_manifest(layout.name, key, files, toolchain=tc, flags=[FLAGS])
    store = RecordingStore(tmp_path)
    assert publish(store, ns, key, files, manifest).status is PublishStatus.PUBLISHED
    assert name == "compile_flags.txt" and store.order[-1] == "model.neff" and "model.done" not in store.order
    (entry,) = scan(store, read_manifests=True).entries
    assert (entry.state, entry.marker_name, entry.problems) == (EntryState.SUCCESS, "model.neff", ())
    assert "model.done" not in entry.files and entry.manifest is not None
    # The name the text-form runtime computes for these flags (an independent writer's).
    assert entry.key.split("+")[1] == module_name(b"", FLAGS, ERA_BOTH, form="text").split("+")[1] == "abb26765"
