"""What the layouts say their keys are made of (layouts/keyparts.py), checked against keys the
runtime wrote (tests/runtime_caches.py, an independent writer) and the real names in docs/runtimes.md."""

from __future__ import annotations

import hashlib

import pytest

from neffcache.entry import Namespace
from neffcache.errors import FlagsFileError
from neffcache.layouts import LAYOUTS, get_layout
from tests.runtime_caches import ERA_BOTH, ERA_JSON, ERA_TXT, VERSION, module_name, native_key

A = get_layout("neuronxcc")
B = get_layout("torchneuron")
HLO = b"HloModule m" * 50


def ns(version: str, target: str | None = "trn1", lnc: int | None = 1, form: str | None = None) -> Namespace:
    return Namespace(A.name, "", version, target, lnc, form)


@pytest.mark.parametrize(("version", "form"), [(ERA_TXT, None), (ERA_JSON, None), (VERSION, None),
                                               (ERA_BOTH, "text"), (ERA_BOTH, "list")])
@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_layout_a_recomputes_the_key_the_runtime_wrote_in_every_form(version: str, form: str | None,
                                                                     target: str) -> None:
    written = module_name(HLO, "--model-type=transformer --optlevel=1", version, target, form)
    space = ns(version, target, form=form)
    assert A.key_with_flags(written, space, ["--model-type=transformer", "--optlevel=1"]) == written
    # Another flag, another order: another key.
    assert A.key_with_flags(written, space, ["--optlevel=1", "--model-type=transformer"]) != written


def test_the_real_suffixes_of_docs_runtimes() -> None:
    assert A.key_with_flags("MODULE_1+x", ns("2.16.345.0"), []) == "MODULE_1+e30acd3a"
    assert A.key_with_flags("MODULE_1+x", ns("2.13.0.0"), ["--model-type=transformer"]) == "MODULE_1+abb26765"
    assert A.key_with_flags("MODULE_1+x", ns("2.13.0.0"), []) == "MODULE_1+d41d8cd9"
    # The wrapper's own options never reach the key.
    assert A.key_with_flags("MODULE_1+x", ns("2.21.0.0"), ["--cache_dir=/x", "--retry_failed_compilation"]) \
        == "MODULE_1+e30acd3a"
    assert A.key_flags(["--cache_dir", "/x", "--lnc=2"]) == ["--lnc=2"]


def test_the_target_form_needs_the_target() -> None:
    with pytest.raises(FlagsFileError, match="target"):
        A.key_with_flags("MODULE_1+x", ns("2.16.345.0", target=None), [])
    assert A.key_with_flags("MODULE_1+x", ns("2.16.344.0", target=None), []) == \
        A.key_with_flags("MODULE_1+x", ns("2.16.344.0", target="trn2"), [])


def test_the_rules_by_form() -> None:
    rules = [A.key_rule(ns(v)) for v in ("2.13.1.0", "2.14.1.0", "2.16.344.9", "2.16.345.0", "2.27.5334.0+f702b353")]
    assert [r.form if r else "?" for r in rules] == ["text", "list", "list", "target", "target"]
    assert [r.since if r else "?" for r in rules] == [None, "2.14", "2.14", "2.16.345.0", "2.16.345.0"]
    assert [r.target_in_key if r else "?" for r in rules] == [False, False, False, True, True]
    # The decided form wins over the version: a 2.21 namespace whose entries are list.
    forced = A.key_rule(ns("2.21.0.0", form="list"))
    assert forced is not None and forced.form == "list" and not forced.target_in_key
    assert A.key_rule(ns("not-a-version")) is None and B.key_rule(ns("2.21.0.0")) is None
    # Read off an entry's own flags file: only when it backs the key.
    assert (r := A.key_rule_of_file("MODULE_1+e30acd3a", "compile_flags.json", b'["--target=trn1"]')) is not None
    assert r.form == "target"
    assert A.key_rule_of_file("MODULE_1+00000000", "compile_flags.json", b'["--target=trn1"]') is None


def test_which_layout_claims_a_key_and_its_graph() -> None:
    graph = str(int.from_bytes(hashlib.sha256(HLO).digest()[:8], "big"))
    key = module_name(HLO)
    assert A.claims_key(key) and A.graph_of(key) == graph
    assert not A.claims_key(native_key("aten::add")) and B.claims_key(native_key("aten::add"))
    assert B.claims_key("f" * 64) and not B.claims_key("F" * 32) and not B.claims_key("f" * 31)
    assert B.graph_of("f" * 32) is None and B.key_with_flags("f" * 32, ns(VERSION), []) is None
    claimed = [lay.name for lay in LAYOUTS.values() if lay.claims_key(key)]
    assert claimed == [A.name]


def test_flags_files_beside_an_hlo_and_the_target_they_record() -> None:
    assert A.flags_beside("model.hlo_module.pb") == ("compile_flags.json", "compile_flags.txt")
    assert A.flags_beside("model.MODULE_1+e30acd3a.hlo_module.pb") == A.flags_beside("model.hlo.pb")
    assert A.flags_beside("model.neff") == () and B.flags_beside("model.hlo_module.pb") == ()
    assert B.flags_beside(f"{'a' * 32}.hlo") == (f"{'a' * 32}.flags.json",)
    assert A.flags_target("compile_flags.json", b'["--target=trn2", "--lnc=2"]') == "trn2"
    assert A.flags_target("compile_flags.json", b'["--lnc=2"]') is None
    assert A.flags_target("compile_flags.json", b"not json") is None
