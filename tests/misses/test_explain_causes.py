"""why-miss names the cause of each kind of drift, against entries on disk as the runtime wrote them.

The stores are filled by tests/runtime_caches.py (an independent writer of layout A, byte for
byte, without neffcache's layouts), read back through a real scan; the missed graph is named as
a user names it: an entry path, a bare key, an HLO file with its flags.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from neffcache.index import NullIndex
from neffcache.layouts import get_layout
from neffcache.misses.causes import Explanation
from neffcache.misses.explain import Field, FoundIn, Match
from neffcache.misses.inputs import Known, missed_from_argument, missed_from_report
from neffcache.misses.nearest import StoreCatalog, why_miss
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import publish
from neffcache.stores.local import LocalStore
from neffcache.toolchain import Toolchain
from tests.runtime_caches import ERA_BOTH, ERA_JSON, VERSION, module_name, write_native_neff, write_runtime_a

V21 = VERSION  # 2.21.33363.0+82129205
V16 = "2.16.372.0+0badc0de"  # the target form, like every later compiler
V22 = "2.22.4455.0+0123abcd"
HLO = b"HloModule train_step " + bytes(range(256)) * 40
FLAGS = "--model-type=transformer"
LAYOUT_A = get_layout("neuronxcc")


def explain(root: Path, what: str, known: Known | None = None) -> Explanation:
    catalog = StoreCatalog.build(LocalStore(root))
    (found,) = why_miss([missed_from_argument(what, known or Known())], [catalog], NullIndex())
    return found


def entry_path(root: Path, entry: Path) -> str:
    return entry.relative_to(root).as_posix()


def hlo_file(tmp_path: Path, hlo: bytes = HLO) -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "model.hlo_module.pb").write_bytes(hlo)
    return str(work / "model.hlo_module.pb")


def test_a_compiler_bump_is_named_and_the_rewarm_that_would_have_hit(tmp_path: Path) -> None:
    root = tmp_path / "store"
    old = write_runtime_a(root / "trn2-lnc2", HLO, version=V21, flags=FLAGS, target="trn2")
    # Within one flags-file era the MODULE name recurs: the job on 2.22 looks for the same name.
    wanted = f"trn2-lnc2/neuronxcc-{V22}/{old.name}"
    found = explain(root, wanted)
    assert found.cause == "compiler 2.21 → 2.22"
    assert f"neffcache rewarm --from-compiler {V21}" in found.fix
    best = found.comparisons[0]
    assert best.candidate.path == entry_path(root, old) and best.candidate.source is FoundIn.STORE
    assert best.match(Field.FLAGS) is Match.SAME  # inferred: the key is the one the entry's flags give
    assert [d.field for d in best.differences if d.match is Match.DIFFERENT] == [Field.COMPILER]
    assert "not asked" in found.index


def test_one_flag_added(tmp_path: Path) -> None:
    root = tmp_path / "store"
    old = write_runtime_a(root / "trn2-lnc2", HLO, version=V21, flags=FLAGS, target="trn2")
    known = Known(compiler_version=V21, target="trn2", lnc=2, flags=(FLAGS, "--enable-fast-loading-neuron-binaries"))
    found = explain(root, hlo_file(tmp_path), known)
    assert found.cause == "flag `--enable-fast-loading-neuron-binaries` added"
    assert found.fix.startswith(f"rerun with the flags of entry {entry_path(root, old)}: `{FLAGS}`")
    assert found.comparisons[0].candidate.why == "same HLO"  # found by size, confirmed by hashing the file


def test_a_path_in_the_flags_is_named_as_the_cause(tmp_path: Path) -> None:
    root = tmp_path / "store"
    write_runtime_a(root / "trn2-lnc2", HLO, version=V21, flags=f"{FLAGS} --logfile=/tmp/job-41/neuron.log",
                    target="trn2")
    known = Known(compiler_version=V21, target="trn2", lnc=2, flags=(FLAGS, "--logfile=/tmp/job-42/neuron.log"))
    found = explain(root, hlo_file(tmp_path), known)
    assert found.cause == "flag `--logfile=...` differs: a path in the flags changes the key"
    assert "keep per-run paths out of the compiler flags" in found.fix
    assert found.comparisons[0].flags is not None and found.comparisons[0].flags.path_flags() == ["--logfile"]


def test_target_trn1_vs_trn2(tmp_path: Path) -> None:
    root = tmp_path / "store"
    write_runtime_a(root / "trn1-lnc1", HLO, version=V21, flags=FLAGS, target="trn1")
    # From 2.21 the target is in the flags file: the trn2 job's MODULE name has another suffix.
    found = explain(root, f"trn2-lnc1/neuronxcc-{V21}/{module_name(HLO, FLAGS, V21, 'trn2')}")
    assert found.cause == "target trn1 vs trn2"
    assert "neffcache warm --instance trn2.48xlarge" in found.fix
    assert found.comparisons[0].match(Field.FLAGS) is Match.SAME


def test_target_and_lnc_from_an_instance_type(tmp_path: Path) -> None:
    root = tmp_path / "store"
    write_runtime_a(root / "trn1-lnc1", HLO, version=V21, flags=FLAGS, target="trn1")
    found = explain(root, hlo_file(tmp_path), Known(compiler_version=V21, target="trn2", lnc=2, flags=(FLAGS,)))
    assert found.cause == "target trn1 vs trn2; LNC 1 vs 2"


def test_lnc_1_vs_2(tmp_path: Path) -> None:
    root = tmp_path / "store"
    old = write_runtime_a(root / "trn2-lnc1", HLO, version=V21, flags=FLAGS, target="trn2")
    found = explain(root, f"trn2-lnc2/neuronxcc-{V21}/{old.name}")
    assert found.cause == "LNC 1 vs 2"
    assert found.fix.startswith(f"run the job with LNC 1 to use {entry_path(root, old)}")


def test_the_flags_form_change_at_2_16_345_same_flags_new_suffix(tmp_path: Path) -> None:
    root = tmp_path / "store"  # a root libneuronxla filled itself: no target directory
    old = write_runtime_a(root, HLO, version=ERA_JSON, flags=FLAGS, target="trn1")
    new_name = module_name(HLO, FLAGS, V16, "trn1")
    assert new_name != old.name  # the same user flags, another suffix
    # A bare key and the job's compiler: the target is found by recomputing the key.
    found = explain(root, new_name, Known(compiler_version=V16))
    assert found.cause == "compiler 2.15 → 2.16; flags-file form list → target (same flags, new suffix)"
    assert f"neffcache rewarm --from-compiler {ERA_JSON}" in found.fix
    best = found.comparisons[0]
    assert best.candidate.path == entry_path(root, old)
    target = next(d for d in best.differences if d.field is Field.TARGET)
    assert (target.wanted, target.note) == ("trn1", "inferred from the key")
    rule = next(d for d in best.differences if d.field is Field.KEY_RULE)
    assert (rule.found, rule.wanted, rule.note) == ("list", "target", "job's: version table; entry's: its flags file")


def test_keys_are_compared_under_the_namespaces_own_form_and_the_rule_is_said(tmp_path: Path) -> None:
    """2.14.227.0 shipped with two forms: a namespace whose entries a text-form runtime wrote
    names a missing graph in the text form, whatever the version table says."""
    root = tmp_path / "store"
    write_runtime_a(root / "trn2-lnc2", b"another graph", version=ERA_BOTH, flags=FLAGS, target="trn2", form="text")
    old = write_runtime_a(root / "trn2-lnc2", HLO, version=ERA_JSON, flags=FLAGS, target="trn2")
    missed = f"trn2-lnc2/neuronxcc-{ERA_BOTH}/{module_name(HLO, FLAGS, ERA_BOTH, form='text')}"
    found = explain(root, missed)
    assert found.missed.parts.flags_form == "text" and found.missed.parts.form_rule == "entries"
    assert found.missed.form_explanation.startswith(f"trn2-lnc2/neuronxcc-{ERA_BOTH}: flags form text (entries)")
    assert found.cause == "compiler 2.15 → 2.14; flags-file form list → text (same flags, new suffix)"
    assert found.comparisons[0].candidate.path == entry_path(root, old)
    data = found.to_json()["missed"]
    assert (data["flags_form"], data["flags_form_rule"]) == ("text", "entries")
    assert data["flags_form_decision"]["rule"] == "entries" and data["flags_form_decision"]["evidence"]["forms"] == {
        "text": 1}


def test_a_key_only_another_form_gives_is_named_by_that_form(tmp_path: Path) -> None:
    """The 0-of-3 case: entries named in the list form in a 2.16.372.0 namespace, and a
    target-form runtime that looked for its own names. The namespace's entries say list; the
    missed key itself says target (its md5 is what the entry's flags give under that form)."""
    root = tmp_path / "store"
    wrong = write_runtime_a(root / "trn2-lnc2", HLO, version=V16, flags=FLAGS, target="trn2", form="list")
    missed = f"trn2-lnc2/neuronxcc-{V16}/{module_name(HLO, FLAGS, V16, 'trn2')}"
    found = explain(root, missed)
    assert found.missed.parts.form_rule == "entries" and found.missed.parts.flags_form == "list"
    best = found.comparisons[0]
    assert best.candidate.path == entry_path(root, wrong)
    rule = next(d for d in best.differences if d.field is Field.KEY_RULE)
    assert (rule.match, rule.found, rule.wanted) == (Match.DIFFERENT, "list", "target")
    assert rule.note == "job's: inferred from the key; entry's: its flags file"
    assert best.match(Field.FLAGS) is Match.SAME
    assert found.cause == "flags-file form list → target (same flags, new suffix)"
    assert "--flags-form target" in found.fix


def test_a_key_whose_flags_part_no_entry_gives_is_a_flag_difference(tmp_path: Path) -> None:
    root = tmp_path / "store"
    old = write_runtime_a(root / "trn2-lnc2", HLO, version=V21, flags=FLAGS, target="trn2")
    found = explain(root, f"trn2-lnc2/neuronxcc-{V21}/MODULE_{_graph()}+0badf1a9")
    assert found.cause == "flags differ: the key is not the one this entry's flags give"
    assert found.comparisons[0].candidate.path == entry_path(root, old)


def test_a_failed_entry_is_its_own_cause(tmp_path: Path) -> None:
    root = tmp_path / "store"
    failed = write_runtime_a(root / "trn2-lnc2", HLO, version=V21, flags=FLAGS, target="trn2", state="FAILED")
    found = explain(root, entry_path(root, failed))
    assert found.cause.startswith("the entry itself is FAILED")
    assert "neffcache warm --retry-failed" in found.fix


def test_an_entry_held_where_the_job_looks_is_no_miss(tmp_path: Path) -> None:
    root = tmp_path / "store"
    held = write_runtime_a(root / "trn2-lnc2", HLO, version=V21, flags=FLAGS, target="trn2")
    found = explain(root, entry_path(root, held))
    assert found.held == (LocalStore(root).url,) and found.comparisons == ()
    assert found.cause == f"{entry_path(root, held)} is held in {LocalStore(root).url}: no miss there"


def test_a_changed_graph_of_the_same_model(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = LocalStore(root)
    tc = Toolchain(V21, "trn2", 2)
    ns = LAYOUT_A.namespace_for(tc)
    name, data = LAYOUT_A.flags_file(ns, "MODULE_1+x", [FLAGS])
    key = LAYOUT_A.key_with_flags("MODULE_1+x", ns, [FLAGS])
    assert key is not None and name is not None
    files = {"model.hlo_module.pb": b"HloModule an older graph", name: data, "model.neff": b"NEFF" * 100,
             "model.done": b""}
    manifest = build_manifest(LAYOUT_A.name, key, files, toolchain=tc, flags=[FLAGS], tags={"model": "llama"})
    assert publish(store, ns, key, files, manifest).ok
    report = tmp_path / "plan.json"
    report.write_text(json.dumps([{"path": f"{ns.path}/MODULE_2+abcdef12", "layout": LAYOUT_A.name,
                                   "namespace": ns.path, "key": "MODULE_2+abcdef12", "toolchain": tc.to_json(),
                                   "hlo_sha256": "a" * 64, "hlo_size": 999, "flags": [FLAGS],
                                   "tags": {"model": "llama"}, "status": "miss"}]))
    (found,) = why_miss(missed_from_report(report), [StoreCatalog.build(store)], NullIndex())
    assert found.cause == "the graph changed: another HLO under the same model tag `model=llama`"
    assert found.fix.startswith("nothing stored could have hit: warm the new graph")


def test_nothing_near_says_where_it_looked(tmp_path: Path) -> None:
    root = tmp_path / "store"
    write_runtime_a(root / "trn2-lnc2", HLO, version=V21, flags=FLAGS, target="trn2")
    found = explain(root, hlo_file(tmp_path, b"HloModule something else entirely"), Known(target="trn2"))
    assert found.comparisons == () and found.cause.startswith("no entry shares its HLO, graph or model tag")
    assert found.fix == "warm it: neffcache warm --instance trn2.48xlarge -- <your workload>"


def test_the_nearest_entry_comes_first(tmp_path: Path) -> None:
    root = tmp_path / "store"
    write_runtime_a(root / "trn1-lnc1", HLO, version=ERA_JSON, flags="--model-type=cnn", target="trn1")
    write_runtime_a(root / "trn2-lnc2", HLO, version=V21, flags="--model-type=cnn", target="trn2")
    close = write_runtime_a(root / "trn2-lnc2", HLO, version=V21, flags=FLAGS, target="trn2")
    found = explain(root, hlo_file(tmp_path), Known(compiler_version=V21, target="trn2", lnc=2,
                                                   flags=(FLAGS, "-O2")))
    ranked = [(c.candidate.path, c.count(Match.DIFFERENT)) for c in found.comparisons]
    assert ranked[0] == (entry_path(root, close), 1) and [n for _, n in ranked] == sorted(n for _, n in ranked)
    assert len(ranked) == 3 and found.cause == "flag `-O2` added"


def _graph() -> str:
    return str(int.from_bytes(hashlib.sha256(HLO).digest()[:8], "big"))


def test_a_native_key_found_under_another_compiler(tmp_path: Path) -> None:
    root = tmp_path / "store"
    neff = write_native_neff(root / f"trn2-lnc2/torchneuron-{V21}/neff", "aten::mm_t0_(128, 128)")
    key = neff.name.removesuffix(".neff")
    found = explain(root, f"trn2-lnc2/torchneuron-{V22}/neff/{key[:2]}/{key[2:4]}/{key}")
    assert found.cause == "compiler 2.21 → 2.22"
    assert found.comparisons[0].candidate.why == "same key"


def test_a_crafted_manifest_or_flags_file_in_a_store_is_reported_and_the_rest_compared(tmp_path: Path) -> None:
    root = tmp_path / "store"
    old = write_runtime_a(root / "trn2-lnc2", HLO, version=V21, flags=FLAGS, target="trn2")
    (old / "neffcache.json").write_bytes(b"[" * 100_000)
    other = write_runtime_a(root / "trn2-lnc1", HLO, version=V21, flags=FLAGS, target="trn2")
    (other / "compile_flags.json").write_bytes(b"\x00" * (2 << 20))  # far above any flags file
    catalog = StoreCatalog.build(LocalStore(root))
    (found,) = why_miss([missed_from_argument(f"trn2-lnc2/neuronxcc-{V22}/{old.name}", Known())], [catalog],
                        NullIndex())
    assert found.cause == "compiler 2.21 → 2.22"  # the corrupt manifest hid nothing the listing and flags file say
    assert any("neffcache.json" in p for p in catalog.problems)
    flags = {c.candidate.path: c.match(Field.FLAGS) for c in found.comparisons}
    assert flags[entry_path(root, other)] is Match.UNKNOWN  # an oversized flags file is not read


def test_a_fix_names_the_instance_asked_about_or_the_targets_largest() -> None:
    """Asked about a trn1.32xlarge job, the fix warms for trn1.32xlarge, never trn1.2xlarge."""
    from neffcache.misses.causes import instance_for

    assert instance_for("trn1", "trn1.32xlarge") == "trn1.32xlarge"
    assert instance_for("trn1", "trn1.2xlarge") == "trn1.2xlarge"  # what was asked, even the small one
    assert instance_for("trn1", None) == "trn1.32xlarge"  # the family's largest, not its first
    assert instance_for("trn2", "trn1.32xlarge") == "trn2.48xlarge"  # asked about another target
    assert instance_for(None, "trn1.32xlarge") == "<instance>"
