"""SigV4 signing of a PutObject whose body's sha256 neffcache already took.

Over plain HTTP (an on-premises endpoint, moto) botocore signs every payload: it reads the
whole body once more to hash it for ``X-Amz-Content-SHA256``, and S3 rejects a body that does
not match. A verified upload has just hashed exactly those bytes (the buffer it sends, see
s3_transfer.read_whole), so that second pass over every byte is pure cost. This signer takes the
digest instead, through botocore's own extension points: a ``choose-signer`` handler selects it
for a PutObject that carries a digest in its request context, and a ``before-call`` handler
puts the digest there from the calling thread. The signature is what botocore would compute;
if the digest were wrong, S3 would refuse the upload, so it doubles as a check by the server
of the bytes neffcache hashed. Over HTTPS botocore sends no payload digest for these uploads
(a CRC32 trailer instead), and this signer leaves those requests exactly as botocore makes them.

The same reasoning sets which requests carry a CRC32 (:func:`checksum_options`): over plain HTTP
every body is signed with its sha256, which S3 checks, so a CRC32 of it as well (botocore's
default, computed in one more pass over every byte sent) checks the same bytes a second, weaker
way. Those requests go without it; over HTTPS, where the CRC32 is the only check, it stays.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from botocore.auth import AUTH_TYPE_MAPS, S3SigV4Auth

SIGNATURE_VERSION = "neffcache-s3v4"
_CONTEXT_KEY = "neffcache_payload_sha256"
_pending = threading.local()


class KnownPayloadS3SigV4Auth(S3SigV4Auth):  # type: ignore[misc]  # botocore ships no types
    """S3's SigV4, with the payload's sha256 taken from the request context when it is there."""

    def payload(self, request: Any) -> str:
        known = request.context.get(_CONTEXT_KEY)
        if known and not self._is_streaming_checksum_payload(request) and self._should_sha256_sign_payload(request):
            return str(known)
        return str(super().payload(request))


AUTH_TYPE_MAPS.setdefault(SIGNATURE_VERSION, KnownPayloadS3SigV4Auth)


@contextlib.contextmanager
def payload_sha256(hexdigest: str | None) -> Iterator[None]:
    """Within this block, a PutObject made by this thread is signed with ``hexdigest`` as its
    payload's sha256 (which must be that of the body it sends)."""
    _pending.sha256 = hexdigest
    try:
        yield
    finally:
        _pending.sha256 = None


def _before_call(context: dict[str, Any], **_: Any) -> None:
    known = getattr(_pending, "sha256", None)
    if known:
        context[_CONTEXT_KEY] = known


def _choose_signer(context: dict[str, Any], signature_version: str, **_: Any) -> str | None:
    # Plain SigV4 only (botocore's own handler, which runs after this one, would make "v4"
    # "s3v4" for S3): SigV4a, S3 Express and unsigned requests are left to it.
    if context.get(_CONTEXT_KEY) and signature_version in ("s3v4", "v4"):
        return SIGNATURE_VERSION
    return None


def payload_signed(endpoint: str | None) -> bool:
    """Whether every request body sent to ``endpoint`` is signed with its sha256: botocore
    always signs payloads over plain HTTP, and S3 refuses a body that does not match. None is
    AWS's own endpoint (HTTPS: an unsigned payload with a CRC32) or one botocore finds in the
    AWS config: botocore's defaults stay for both."""
    return endpoint is not None and urlsplit(endpoint).scheme.lower() == "http"


def checksum_options(endpoint: str | None) -> dict[str, str]:
    """botocore ``Config`` options for a client of ``endpoint``: a CRC32 only where S3 requires
    one (DeleteObjects) when every body is signed with its sha256 anyway; botocore's default
    (a CRC32 on every upload) otherwise."""
    return {"request_checksum_calculation": "when_required"} if payload_signed(endpoint) else {}


def part_checksum(endpoint: str | None) -> str | None:
    """The ``ChecksumAlgorithm`` of a multipart upload to ``endpoint`` (None: the parts' signed
    sha256 is their check, see :func:`checksum_options`)."""
    return None if payload_signed(endpoint) else "CRC32"


def register(events: Any) -> None:
    """Install the two handlers on one client's event system (``client.meta.events``)."""
    events.register("before-call.s3.PutObject", _before_call)
    events.register_first("choose-signer.s3.PutObject", _choose_signer)
