"""Secrets out of what neffcache writes down: the one place a command line or a message is
redacted before it reaches a journal, a log or a report.

::

    redact_argv(["neffcache", "verify", "--fix", "--token", "nfc_ab12_s3cret"])
    # ['neffcache', 'verify', '--fix', '--token', '***']
    redact_text("pull s3://b/p --index https://ci:hunter2@idx/?token=x")
    # 'pull s3://b/p --index https://ci:***@idx/?token=***'

What counts as a secret: the value of an option whose name says so (``--token X``,
``--token=X``, ``--password``, ``--secret``, ``--api-key``...), an environment assignment of
such a name (``NEFFCACHE_TOKEN=X``, ``AWS_SECRET_ACCESS_KEY=X``), neffcache's own token format
(``nfc_<id>_<secret>``) wherever it stands, the password of a URL's user info, a query
parameter of such a name (``?token=``, ``X-Amz-Signature=``), and an ``Authorization`` value.
The rules match by *name*, never by guessing at the value, so a value is redacted whatever it
looks like; the token pattern catches a secret passed positionally or pasted into a message.

The module is pure (no I/O, no state), so a journal written today and one read from an older
store (``prune --history``) go through the same function. The CLI applies it to its error
lines and, through :class:`RedactingFilter`, to every log record it prints.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

MASK = "***"

# Names whose values are secrets: options, environment variables, query parameters, headers.
_SENSITIVE_NAME = (r"[A-Za-z0-9_.-]*(?:token|secret|passw(?:or)?d|credential|signature|api[-_]?key"
                   r"|access[-_]?key|auth)[A-Za-z0-9_.-]*")
_SENSITIVE_NAME_RE = re.compile(rf"^{_SENSITIVE_NAME}$", re.IGNORECASE)
# neffcache's token: nfc_<id>_<secret> (server/services/tokens.py); the id is public, the rest not.
_NFC = re.compile(r"\b(nfc_[A-Za-z0-9]+_)[A-Za-z0-9_\-]+")
# scheme://user:password@host -> scheme://user:***@host (user alone is kept: it names no secret)
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^/\s@]*@")
# ?name=value or &name=value with a secret name
_QUERY = re.compile(rf"([?&;]{_SENSITIVE_NAME}=)[^&#\s]*", re.IGNORECASE)
# --name=value and NAME=value with a secret name
_ASSIGN = re.compile(rf"((?:^|(?<=[\s'\"]))-{{0,2}}{_SENSITIVE_NAME}=)(?:'[^']*'|\"[^\"]*\"|\S*)", re.IGNORECASE)
# "Authorization: Bearer x", "authorization=Basic x" (one scheme word, then the credential)
_AUTHORIZATION = re.compile(r"(\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)(?:[A-Za-z]+\s+)?[^\s\"',}]+",
                            re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """True for an option, variable, parameter or header name whose value is a secret."""
    return bool(_SENSITIVE_NAME_RE.match(name.lstrip("-")))


def redact_text(text: str) -> str:
    """``text`` with every secret the module docstring lists replaced by ``***``."""
    text = _AUTHORIZATION.sub(rf"\g<1>{MASK}", text)
    text = _USERINFO.sub(rf"\g<1>{MASK}@", text)
    text = _QUERY.sub(rf"\g<1>{MASK}", text)
    text = _ASSIGN.sub(rf"\g<1>{MASK}", text)
    return _NFC.sub(rf"\g<1>{MASK}", text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with secrets redacted: the word after a secret-named option (``--token X``) as a
    whole, and every word through :func:`redact_text`."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        hide_next = arg.startswith("-") and "=" not in arg and is_secret_name(arg) and arg != "--"
        out.append(redact_text(arg))
    return out


class RedactingFilter(logging.Filter):
    """A logging filter that redacts every record's message (installed on the CLI's handlers):
    a message may carry an index URL with a password or a token read from a failing request."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True
