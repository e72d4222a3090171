"""A manifest's ``signature`` field as a value: which key signed, and the signature's bytes.

Only the record: no cryptography here, so the manifest parser (a scan reads thousands) neither
loads the crypto library nor pays for it. Signing and checking are neffcache/signing.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ALGORITHM = "ed25519"


@dataclass(frozen=True)
class Signature:
    """A manifest's ``signature``: which key signed, and the signature's bytes (base64)."""

    key_id: str
    value: str
    algorithm: str = ALGORITHM

    def to_json(self) -> dict[str, str]:
        return {"algorithm": self.algorithm, "key_id": self.key_id, "value": self.value}

    @classmethod
    def from_json(cls, data: Any) -> Signature | None:
        """A manifest's ``signature`` (absent: None); ValueError on anything a signer does not write."""
        if data is None:
            return None
        if not isinstance(data, dict) or set(data) != {"algorithm", "key_id", "value"}:
            raise ValueError("'signature' must be an object of algorithm, key_id and value")
        algorithm, key_id, value = data["algorithm"], data["key_id"], data["value"]
        if algorithm != ALGORITHM:
            raise ValueError(f"'signature.algorithm' must be {ALGORITHM}")
        if not isinstance(key_id, str) or len(key_id) != 16 or key_id.strip("0123456789abcdef"):
            raise ValueError("'signature.key_id' must be 16 lowercase hex digits")
        if not isinstance(value, str) or len(value) != 88:
            raise ValueError("'signature.value' must be 64 bytes in base64")
        return cls(key_id, value, algorithm)
