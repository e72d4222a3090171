"""Signed entries end to end, tried as an attacker would (issue 37): a real `neffcache warm` with a
signing key over the simulated toolchain, then `verify`, `pull` and `show` as readers with a trust
policy, each a new process. The attacker is a co-tenant who can write the store but holds no key.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from neffcache.manifest import Manifest
from neffcache.signing import generate
from tests.warmers.conftest import V1, Cli, Index, warm_args

NS = f"trn2-lnc2/neuronxcc-{V1}"


def _warm_signed(cli: Cli, tmp_path: Path) -> tuple[Path, list[str]]:
    """A store warmed by CI with its key; the entries' paths."""
    generate(tmp_path / "ci")
    store = tmp_path / "store"
    cli.json(*warm_args(store, graphs=2), NEFFCACHE_SIGNING_KEY=str(tmp_path / "ci"))
    entries = sorted(str(p.parent.relative_to(store)) for p in store.glob(f"{NS}/MODULE_*/model.done"))
    assert len(entries) == 4, entries  # 2 graphs x 2 buckets
    return store, entries


def _manifest(store: Path, entry: str) -> Manifest:
    return Manifest.from_bytes((store / entry / "neffcache.json").read_bytes())


def _rewrite_neff(store: Path, entry: str, neff: bytes) -> None:
    """The attack: a substitute NEFF, and the manifest's digest of it rewritten to match."""
    (store / entry / "model.neff").write_bytes(neff)
    raw = json.loads((store / entry / "neffcache.json").read_bytes())
    raw["files"]["model.neff"] = {"sha256": hashlib.sha256(neff).hexdigest(), "size": len(neff)}
    (store / entry / "neffcache.json").write_text(json.dumps(raw))


def test_warmed_entries_carry_provenance_and_verify_under_require_signed(cli: Cli, tmp_path: Path) -> None:
    store, entries = _warm_signed(cli, tmp_path)
    manifest = _manifest(store, entries[0])
    assert manifest.signature is not None and manifest.provenance is not None
    assert manifest.provenance.how == "warm" and manifest.provenance.identity == manifest.signature.key_id
    assert manifest.provenance.toolchain is not None and manifest.provenance.toolchain.compiler_version == V1
    trusted = {"NEFFCACHE_TRUSTED_KEYS": str(tmp_path / "ci.pub")}
    report = cli.json("verify", str(store), "--require-signed", **trusted)
    assert (report["ok"], report["refused"], report["trust"]) == (4, 0, {"signed": 4})
    shown = cli.json("show", str(store), entries[0], **trusted)
    assert shown["trust"]["verdict"] == "signed" and shown["manifest"]["provenance"]["how"] == "warm"
    text = cli.run("show", str(store), entries[0], **trusted).stdout
    assert "provenance: warm by" in text and "trust: signed" in text


def test_a_rewritten_neff_and_digest_is_refused_by_verify_and_pull(cli: Cli, tmp_path: Path) -> None:
    store, entries = _warm_signed(cli, tmp_path)
    victim = entries[1]
    _rewrite_neff(store, victim, b"NEFF attacker's substitute")
    trusted = {"NEFFCACHE_TRUSTED_KEYS": str(tmp_path / "ci.pub")}
    # Without a trust policy the forged digests pass: the signature is what catches it.
    assert cli.json("verify", str(store))["corrupt"] == 0
    proc = cli.run("verify", str(store), "--require-signed", "--json", **trusted)
    assert proc.returncode == 15, proc.stderr
    report = json.loads(proc.stdout)
    assert [u["path"] for u in report["untrusted"]] == [victim] and report["ok"] == 3
    assert report["untrusted"][0]["trust"] == "bad-signature"
    # Refused whatever require_signed says: a trusted key's id over bytes it did not sign.
    assert cli.run("verify", str(store), **trusted).returncode == 15

    local = tmp_path / "node"
    pulled = cli.run("pull", str(store), str(local), "--require-signed", "--json", **trusted)
    assert pulled.returncode == 1, pulled.stderr
    data = json.loads(pulled.stdout)
    assert [f["path"] for f in data["failures"]] == [victim] and "bad-signature" in data["failures"][0]["reason"]
    assert sorted(data["copied_paths"]) == sorted(set(entries) - {victim})
    assert not (local / victim).exists()


def test_a_signed_entry_copied_to_another_key_is_refused(cli: Cli, tmp_path: Path) -> None:
    store, entries = _warm_signed(cli, tmp_path)
    # The attacker moves a genuine signed entry over another graph's name: every byte is signed.
    source, target = entries[0], entries[2]
    shutil.rmtree(store / target)
    shutil.copytree(store / source, store / target)
    report = json.loads(cli.run("verify", str(store), "--json", NEFFCACHE_TRUSTED_KEYS=str(tmp_path / "ci.pub")).stdout)
    refused = {u["path"]: u["trust"] for u in report["untrusted"]}
    assert refused == {target: "bad-signature"}


def test_unsigned_entries_are_reported_and_refused_only_when_signatures_are_required(cli: Cli, tmp_path: Path
                                                                                     ) -> None:
    store = tmp_path / "store"
    cli.json(*warm_args(store, graphs=1))  # no signing key: published unsigned
    generate(tmp_path / "ci")
    trusted = {"NEFFCACHE_TRUSTED_KEYS": str(tmp_path / "ci.pub")}
    plain = cli.json("verify", str(store), **trusted)
    assert (plain["ok"], plain["trust"]) == (2, {"unsigned": 2})
    assert "--require-signed refuses unsigned" in cli.run("verify", str(store), **trusted).stdout
    required = cli.run("verify", str(store), "--require-signed", "--json", **trusted)
    assert required.returncode == 15 and json.loads(required.stdout)["refused"] == 2


def test_an_untrusted_or_out_of_scope_key_is_refused(cli: Cli, tmp_path: Path) -> None:
    store, _ = _warm_signed(cli, tmp_path)
    generate(tmp_path / "other")
    unknown = cli.run("verify", str(store), "--require-signed", "--json",
                      NEFFCACHE_TRUSTED_KEYS=str(tmp_path / "other.pub"))
    assert unknown.returncode == 15 and json.loads(unknown.stdout)["trust"] == {"unknown-key": 4}
    # The CI key may sign only for another store (a pull-request tier's key on main's store).
    (tmp_path / "neffcache.toml").write_text(
        f'[[trust]]\nkey = "{tmp_path / "ci.pub"}"\nstores = ["s3://bucket/pr/123"]\n')
    scoped = cli.run("verify", str(store), "--json", NEFFCACHE_CONFIG=str(tmp_path / "neffcache.toml"))
    assert scoped.returncode == 15 and json.loads(scoped.stdout)["trust"] == {"out-of-scope": 4}


def test_a_trn1_entry_in_a_trn2_namespace_is_reported(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    cli.json(*warm_args(store, graphs=1))
    entry = sorted(store.glob(f"{NS}/MODULE_*/compile_flags.json"))[0].parent
    # The runtime's target form leads with the target: a trn1 compile's file, in trn2's namespace,
    # its manifest made to agree (digests alone cannot tell).
    flags = json.dumps(["--target=trn1", "--model-type=transformer"]).encode()
    (entry / "compile_flags.json").write_bytes(flags)
    raw = json.loads((entry / "neffcache.json").read_bytes())
    raw["files"]["compile_flags.json"] = {"sha256": hashlib.sha256(flags).hexdigest(), "size": len(flags)}
    (entry / "neffcache.json").write_text(json.dumps(raw))
    proc = cli.run("verify", str(store), "--json")
    assert proc.returncode == 15, proc.stderr
    untrusted = json.loads(proc.stdout)["untrusted"]
    assert [(u["path"], u["status"]) for u in untrusted] == [(str(entry.relative_to(store)), "mismatch")]
    assert any(p.startswith("target: compiled with --target=trn1") for p in untrusted[0]["problems"])


def test_a_lost_manifest_is_reported_and_not_papered_over_by_push(cli: Cli, tmp_path: Path, index: Index) -> None:
    store = tmp_path / "store"
    cli.json(*warm_args(store, graphs=2))  # registered with the index: each NEFF's digest
    entries = sorted(str(p.parent.relative_to(store)) for p in store.glob(f"{NS}/MODULE_*/model.done"))
    swapped, bare = entries[0], entries[1]
    # The attack: a substitute NEFF and no manifest, so it reads as a runtime's own entry.
    (store / swapped / "model.neff").write_bytes(b"NEFF substitute")
    (store / swapped / "neffcache.json").unlink()
    (store / bare / "neffcache.json").unlink()  # the manifest alone lost; the NEFF is genuine
    proc = cli.run("verify", str(store), "--json")
    assert proc.returncode == 15, proc.stderr
    problems = {u["path"]: " ".join(u["problems"]) for u in json.loads(proc.stdout)["untrusted"]}
    assert problems.keys() == {swapped, bare}
    assert "substitute is likely" in problems[swapped] and "still matches" in problems[bare]

    pushed = cli.run("push", str(store), str(tmp_path / "shared"), "--json")
    assert pushed.returncode == 1, pushed.stderr
    report = json.loads(pushed.stdout)
    assert sorted(f["path"] for f in report["failures"]) == sorted([swapped, bare])
    assert all("--adopt" in f["reason"] for f in report["failures"])
    assert not (tmp_path / "shared" / swapped).exists()
    adopted = cli.json("push", str(store), str(tmp_path / "shared"), "--adopt")
    assert sorted(adopted["copied_paths"]) == sorted([swapped, bare])


def test_promote_reverifies_a_pull_request_tier_and_signs_with_mains_key(cli: Cli, tmp_path: Path) -> None:
    """The branch-tier pattern: PR CI warms its own tier with a key trusted only there; promote
    takes what that key signed into main's tier, signed by main; main's readers trust main's key."""
    generate(tmp_path / "pr")
    generate(tmp_path / "main")
    pr, main = tmp_path / "tiers" / "pr-123", tmp_path / "tiers" / "main"
    cli.json(*warm_args(pr, graphs=2), NEFFCACHE_SIGNING_KEY=str(tmp_path / "pr"))
    entries = sorted(str(p.parent.relative_to(pr)) for p in pr.glob(f"{NS}/MODULE_*/model.done"))
    tampered = entries[0]
    _rewrite_neff(pr, tampered, b"NEFF pushed by a pull request that was not CI")
    trust = tmp_path / "trust.toml"
    trust.write_text(f'[[trust]]\nkey = "{tmp_path / "pr.pub"}"\nstores = ["{pr}"]\n'
                     f'[[trust]]\nkey = "{tmp_path / "main.pub"}"\nstores = ["{main}"]\n')
    readers = {"NEFFCACHE_CONFIG": str(trust)}
    # A PR entry copied to main's tier by hand is out of the PR key's scope there.
    (main / NS).mkdir(parents=True)
    shutil.copytree(pr / entries[1], main / entries[1])
    assert json.loads(cli.run("verify", str(main), "--json", **readers).stdout)["trust"] == {"out-of-scope": 1}
    shutil.rmtree(main / entries[1])

    assert "signing_key" in cli.run("promote", str(pr), str(main), **readers).stderr  # main's key is required
    proc = cli.run("promote", str(pr), str(main), "--json", NEFFCACHE_SIGNING_KEY=str(tmp_path / "main"), **readers)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert [f["path"] for f in report["failures"]] == [tampered] and "bad-signature" in report["failures"][0]["reason"]
    assert sorted(report["copied_paths"]) == entries[1:]
    checked = cli.json("verify", str(main), "--require-signed", **readers)
    assert (checked["ok"], checked["trust"]) == (3, {"signed": 3})
    promoted = _manifest(main, entries[1])
    assert promoted.provenance is not None and promoted.provenance.how == "promote"
    assert promoted.provenance.promoted_from.startswith(f"file://{pr} (key ") and promoted.provenance.user


def test_pull_refuses_a_trn1_entry_in_a_trn2_namespace_and_copies_the_rest(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    cli.json(*warm_args(store, graphs=1))
    entries = sorted(p.parent for p in store.glob(f"{NS}/MODULE_*/compile_flags.json"))
    wrong = entries[0]
    flags = json.dumps(["--target=trn1", "--model-type=transformer"]).encode()
    (wrong / "compile_flags.json").write_bytes(flags)
    raw = json.loads((wrong / "neffcache.json").read_bytes())
    raw["files"]["compile_flags.json"] = {"sha256": hashlib.sha256(flags).hexdigest(), "size": len(flags)}
    (wrong / "neffcache.json").write_text(json.dumps(raw))
    proc = cli.run("pull", str(store), str(tmp_path / "node"), "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert [f["path"] for f in report["failures"]] == [str(wrong.relative_to(store))]
    assert "target: compiled with --target=trn1" in report["failures"][0]["reason"]
    assert report["copied_paths"] == [str(e.relative_to(store)) for e in entries[1:]]
    assert not (tmp_path / "node" / wrong.relative_to(store)).exists()
