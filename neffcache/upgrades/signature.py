"""The signature of a failed compile: what ``upgrade-report`` lists beside each new failure.

It is :func:`neffcache.failures.signature` (16 hex digits over the normalised error lines:
paths, numbers, hashes and temp names stripped), the very key ``neffcache failures`` groups by
and ``neffcache failures bundle`` takes, followed by the first error line as written, so a
reader sees what failed and can pack a reproduction of it in one step.
"""

from __future__ import annotations

from neffcache.failures import first_error, signature

MAX_SIGNATURE = 300
# A failure log is untrusted and may be large (a runtime's whole stderr): read this much of it.
MAX_LOG_BYTES = 64 * 1024


def failure_signature(log: bytes) -> str:
    """``"<signature>: <first error line>"`` of a failed compile whose log holds ``log`` (its
    first bytes will do), printable, at most :data:`MAX_SIGNATURE` characters."""
    text = log[:MAX_LOG_BYTES].decode(errors="replace")
    if not text.strip():
        return "(empty log)"
    first = "".join(c if c.isprintable() else "?" for c in first_error(text))
    return f"{signature(text)}: {first}"[:MAX_SIGNATURE]
