"""Signed manifests and the reader's trust policy, as an attacker would try them (issue 37).

No store here: the values alone (neffcache/signing.py, neffcache/trust.py). Every attack is a
manifest a co-tenant without the private key could write, or a key the policy does not allow.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from neffcache.errors import ConfigError
from neffcache.manifest import FileDigest, Manifest
from neffcache.provenance import How, Provenance, ci_run
from neffcache.signing import PublicKey, SigningKey, generate
from neffcache.toolchain import Toolchain
from neffcache.trust import TrustedKey, TrustPolicy, Verdict

TC = Toolchain("2.27.5334.0+f702b353", "trn2", 2)
PATH = "trn2-lnc2/neuronxcc-2.27.5334.0+f702b353/MODULE_1+abb26765"
MAIN = "s3://cache/main"


def _keys(tmp_path: Path, name: str) -> tuple[SigningKey, PublicKey]:
    generate(tmp_path / name)
    return SigningKey.load(tmp_path / name), PublicKey.load(tmp_path / f"{name}.pub")


def _manifest(neff: str = "a" * 64, compile_seconds: float | None = 12) -> Manifest:
    return Manifest(layout="neuronxcc", key="MODULE_1+abb26765", toolchain=TC, compile_seconds=compile_seconds,
                    files={"model.neff": FileDigest(neff, 2048), "model.done": FileDigest("b" * 64, 0)},
                    provenance=Provenance.here(How.WARM, toolchain=TC, instance="trn2.48xlarge", environ={}))


def test_a_generated_key_pair_signs_what_its_public_key_verifies(tmp_path: Path) -> None:
    signer, public = _keys(tmp_path, "main")
    assert stat.S_IMODE(os.stat(tmp_path / "main").st_mode) == 0o600
    assert signer.id == public.id and len(public.id) == 16
    signed = signer.sign(_manifest(), PATH)
    assert signed.signature is not None and signed.provenance is not None
    assert signed.provenance.identity == signer.id  # the record names who signed it
    # What a reader parses back verifies: numbers read back as floats were signed as such.
    parsed = Manifest.from_bytes(signed.to_bytes())
    assert public.verifies(parsed, PATH) and parsed.provenance == signed.provenance
    with pytest.raises(ConfigError, match="never overwritten"):
        generate(tmp_path / "main")


@pytest.mark.parametrize("attack", ["neff", "digests", "provenance", "tags", "path", "signature"])
def test_a_writer_without_the_key_changes_nothing_a_reader_trusts(tmp_path: Path, attack: str) -> None:
    signer, public = _keys(tmp_path, "main")
    signed = Manifest.from_bytes(signer.sign(_manifest(), PATH).to_bytes())
    policy = TrustPolicy.of([TrustedKey(public)])
    assert policy.judge(MAIN, PATH, "trn2-lnc2/x", signed).verdict is Verdict.SIGNED
    path = PATH
    if attack == "neff":  # the substitute NEFF's digest written into the signed manifest
        forged = dataclasses.replace(signed, files={**signed.files, "model.neff": FileDigest("c" * 64, 4096)})
    elif attack == "digests":
        forged = dataclasses.replace(signed, files={"model.neff": FileDigest("c" * 64, 2048)})
    elif attack == "provenance":
        assert signed.provenance is not None
        forged = dataclasses.replace(signed, provenance=dataclasses.replace(signed.provenance, user="ci-main"))
    elif attack == "tags":
        forged = dataclasses.replace(signed, tags={"team": "other"})
    elif attack == "path":  # a signed entry copied to another graph's name
        forged, path = signed, PATH.replace("MODULE_1", "MODULE_2")
    else:  # another key's signature value under the trusted key's id
        other, _ = _keys(tmp_path, "other")
        assert signed.signature is not None
        forged = dataclasses.replace(other.sign(_manifest(), PATH), signature=dataclasses.replace(
            other.sign(_manifest(), PATH).signature, key_id=signed.signature.key_id))  # type: ignore[arg-type]
    for require in (False, True):
        got = TrustPolicy.of([TrustedKey(public)], require_signed=require).judge(MAIN, path, "trn2-lnc2/x", forged)
        assert (got.verdict, got.refused) == (Verdict.BAD_SIGNATURE, True), got


def test_unsigned_and_unknown_keys_are_reported_and_refused_only_under_require_signed(tmp_path: Path) -> None:
    _, public = _keys(tmp_path, "main")
    stranger, _ = _keys(tmp_path, "stranger")
    for require in (False, True):
        policy = TrustPolicy.of([TrustedKey(public)], require_signed=require)
        for manifest, verdict in ((None, Verdict.UNSIGNED), (_manifest(), Verdict.UNSIGNED),
                                  (stranger.sign(_manifest(), PATH), Verdict.UNKNOWN_KEY)):
            got = policy.judge(MAIN, PATH, "ns", manifest)
            assert (got.verdict, got.refused) == (verdict, require)
            assert got.detail
    assert not TrustPolicy().active and TrustPolicy(require_signed=True).active


def test_scopes_and_revocation(tmp_path: Path) -> None:
    """A pull request's key signs for its own tier only; main's for main's; a revoked key's
    entries are refused even if its signature is good (rotation after a leak)."""
    main_signer, main_pub = _keys(tmp_path, "main")
    pr_signer, pr_pub = _keys(tmp_path, "pr")
    old_signer, old_pub = _keys(tmp_path, "old")
    policy = TrustPolicy.of([TrustedKey(main_pub, stores=(MAIN,), namespaces=("trn2-lnc2/",)),
                             TrustedKey(pr_pub, stores=("s3://cache/pr",)),
                             TrustedKey(old_pub, revoked=True)])
    pr_entry = pr_signer.sign(_manifest(), PATH)
    assert policy.judge("s3://cache/pr/123", PATH, "trn2-lnc2/ns", pr_entry).verdict is Verdict.SIGNED
    moved = policy.judge(MAIN, PATH, "trn2-lnc2/ns", pr_entry)  # copied into main's tier
    assert (moved.verdict, moved.refused) == (Verdict.OUT_OF_SCOPE, True)
    main_entry = main_signer.sign(_manifest(), PATH)
    assert policy.judge(f"{MAIN}/", PATH, "trn2-lnc2/ns", main_entry).verdict is Verdict.SIGNED
    assert policy.judge("s3://cache/main2", PATH, "trn2-lnc2/ns", main_entry).verdict is Verdict.OUT_OF_SCOPE
    assert policy.judge(MAIN, PATH, "trn1-lnc1/ns", main_entry).verdict is Verdict.OUT_OF_SCOPE
    revoked = policy.judge(MAIN, PATH, "trn2-lnc2/ns", old_signer.sign(_manifest(), PATH))
    assert (revoked.verdict, revoked.refused) == (Verdict.REVOKED, True)
    # Listed twice: the widest scope, and revoked wins.
    twice = TrustPolicy.of([TrustedKey(pr_pub, stores=("s3://a",)), TrustedKey(pr_pub), TrustedKey(pr_pub,
                                                                                                 revoked=True)])
    assert twice.keys[pr_pub.id].stores == () and twice.keys[pr_pub.id].revoked


@pytest.mark.parametrize("content", ["", "ed25519", "ed25519 !!!", "rsa AAAA", "ed25519 " + "A" * 44, "x" * 20000])
def test_a_bad_public_key_file_is_a_clear_error(tmp_path: Path, content: str) -> None:
    (tmp_path / "k.pub").write_text(content)
    with pytest.raises(ConfigError, match=r"k\.pub"):
        PublicKey.load(tmp_path / "k.pub")


@pytest.mark.parametrize("bad", [
    {"algorithm": "rsa", "key_id": "0" * 16, "value": "A" * 88},
    {"algorithm": "ed25519", "key_id": "X" * 16, "value": "A" * 88},
    {"algorithm": "ed25519", "key_id": "0" * 16, "value": "A" * 87},
    {"algorithm": "ed25519", "key_id": "0" * 16},
    "signed",
])
def test_a_malformed_signature_or_provenance_makes_the_manifest_corrupt(bad: object) -> None:
    from neffcache.errors import CorruptEntry
    data = _manifest().to_json()
    with pytest.raises(CorruptEntry, match="signature"):
        Manifest.from_json({**data, "signature": bad})
    with pytest.raises(CorruptEntry, match="provenance"):
        Manifest.from_json({**data, "provenance": {**data["provenance"], "user": "x" * 10_000}})


def test_provenance_names_the_ci_run() -> None:
    github = {"GITHUB_REF": "refs/pull/7/merge", "GITHUB_SERVER_URL": "https://github.com",
              "GITHUB_REPOSITORY": "acme/train", "GITHUB_RUN_ID": "42"}
    assert ci_run(github) == {"provider": "github", "ref": "refs/pull/7/merge",
                              "run_url": "https://github.com/acme/train/actions/runs/42"}
    assert ci_run({"CI_COMMIT_REF_NAME": "main", "CI_PIPELINE_URL": "https://gl/p/1"})["provider"] == "gitlab"
    assert ci_run({}) == {}
    described = Provenance.here(How.REWARM, identity="k1", toolchain=TC, environ=github).describe()
    assert "rewarm by" in described and "as k1" in described and "actions/runs/42" in described
