"""Signed manifests: Ed25519 over an entry's manifest, its provenance and its path in the store.

What a signature binds: the canonical JSON of the manifest without its signature (the sha256 and
size of every file, the toolchain, flags, tags, provenance) **and the entry's path in the store**
(:func:`signed_bytes`). So a writer without the private key can change nothing an entry's
readers rely on: not a NEFF (its digest is signed), not the digests (signed), not the record of
who made it, and not where it lies: a signed entry copied to another entry's path is not valid
there. A store prefix (a pull-request tier beside main's) is what the reader's trust policy
scopes keys by (neffcache/trust.py), not something the signature could know: the same entry is
valid in every tier that holds it at the same relative path.

The crypto is the ``cryptography`` package's Ed25519, nothing home-made. A key's id is the first
16 hex digits of the sha256 of its raw public key: what a manifest names, what a trust policy
looks keys up by. Keys on disk: the private key as PKCS#8 PEM (mode 0600, created exclusively:
an existing key is never overwritten), the public key beside it (``PATH.pub``) as one line,
``ed25519 <base64 of the raw 32 bytes> <id>``.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from neffcache.errors import ConfigError
from neffcache.manifest import Manifest
from neffcache.signature import ALGORITHM, Signature

MAX_KEY_FILE = 16 << 10


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def signed_bytes(manifest: Manifest, entry_path: str) -> bytes:
    """What a signature covers: the manifest without its signature, and the entry's path."""
    body = manifest.to_json()
    body.pop("signature", None)
    return json.dumps({"entry": entry_path, "manifest": body}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True).encode()


@dataclass(frozen=True)
class SigningKey:
    """A publisher's private key (setting ``signing_key``, env ``NEFFCACHE_SIGNING_KEY``)."""

    private: Ed25519PrivateKey
    id: str

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SigningKey:
        data = _read_key_file(Path(path), "signing key")
        try:
            private = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"signing key {path}: not an unencrypted PEM private key ({exc})") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise ConfigError(f"signing key {path}: not an Ed25519 key")
        return cls(private, key_id(private.public_key()))

    def sign(self, manifest: Manifest, entry_path: str) -> Manifest:
        """``manifest`` signed for the entry at ``entry_path`` (its provenance names this key)."""
        if manifest.provenance is not None and manifest.provenance.identity != self.id:
            manifest = dataclasses.replace(manifest, provenance=dataclasses.replace(manifest.provenance,
                                                                                    identity=self.id))
        # Through the parser once: what a reader parses is what was signed, numbers included
        # (an int compile time reads back as a float).
        unsigned = Manifest.from_json(dataclasses.replace(manifest, signature=None).to_json())
        value = base64.b64encode(self.private.sign(signed_bytes(unsigned, entry_path))).decode()
        return dataclasses.replace(unsigned, signature=Signature(self.id, value))


@dataclass(frozen=True)
class PublicKey:
    """A reader's trusted public key (a ``.pub`` file)."""

    public: Ed25519PublicKey
    id: str
    source: str = ""

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PublicKey:
        text = _read_key_file(Path(path), "public key").decode(errors="replace").strip()
        parts = text.split()
        if len(parts) < 2 or parts[0] != ALGORITHM:
            raise ConfigError(f"public key {path}: expected a line 'ed25519 <base64> [id]' "
                              "(as `neffcache key generate` writes)")
        try:
            raw = base64.b64decode(parts[1], validate=True)
            public = Ed25519PublicKey.from_public_bytes(raw)
        except (binascii.Error, ValueError) as exc:
            raise ConfigError(f"public key {path}: not an Ed25519 public key ({exc})") from None
        return cls(public, key_id(public), str(path))

    def verifies(self, manifest: Manifest, entry_path: str) -> bool:
        """Whether ``manifest``'s signature is this key's over ``manifest`` at ``entry_path``."""
        sig = manifest.signature
        if sig is None or sig.key_id != self.id:
            return False
        try:
            self.public.verify(base64.b64decode(sig.value, validate=True), signed_bytes(manifest, entry_path))
        except (InvalidSignature, binascii.Error, ValueError):
            return False
        return True


def public_line(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"{ALGORITHM} {base64.b64encode(raw).decode()} {key_id(public)}"


def generate(path: str | os.PathLike[str]) -> tuple[str, str]:
    """Write a new key pair: ``path`` (private, mode 0600, created exclusively) and ``path.pub``.
    Returns (key id, public key line). Refuses to overwrite either file."""
    private_path, public_path = Path(path), Path(f"{path}.pub")
    for existing in (private_path, public_path):
        if existing.exists() or existing.is_symlink():
            raise ConfigError(f"{existing} exists: a key is never overwritten (move it away first)")
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    line = public_line(private.public_key()) + "\n"
    _write_new(private_path, pem, 0o600)
    _write_new(public_path, line.encode(), 0o644)
    return key_id(private.public_key()), line.strip()


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask says
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_KEY_FILE + 1)
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_KEY_FILE:
        raise ConfigError(f"{what} {path}: larger than {MAX_KEY_FILE} bytes, not a key")
    return data
