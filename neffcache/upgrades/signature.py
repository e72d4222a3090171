"""The signature of a failed compile: what ``upgrade-report`` lists beside each new failure.

THE SEAM for the failure-signature normaliser (being built on the branch ``failures``): when it
lands, :func:`failure_signature` calls it, and nothing else changes (its one caller is
:mod:`neffcache.upgrades.compare`). Until then the signature is the log's first line that is
not blank, which for neuronx-cc is its ``ERROR ...`` line, cut to :data:`MAX_SIGNATURE` characters.
"""

from __future__ import annotations

MAX_SIGNATURE = 300
# A failure log is untrusted and may be large (a runtime's whole stderr): read this much of it.
MAX_LOG_BYTES = 64 * 1024


def failure_signature(log: bytes) -> str:
    """The signature of a failed compile whose log holds ``log`` (its first bytes will do)."""
    text = log[:MAX_LOG_BYTES].decode(errors="replace")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    printable = "".join(c if c.isprintable() else "?" for c in first)
    return printable[:MAX_SIGNATURE] or "(empty log)"
