"""Provenance: who produced an entry, how, from what, where and when (a manifest field).

A NEFF from a shared cache runs on the accelerator as is, so the record of where it came from
travels with it: the identity that published it (a signing key's id, an index token's name),
the OS user and host, the command that made it (``warm``, ``rewarm``, ``run``, ``push``...),
the toolchain and instance type it was compiled for, the neffcache version, and the CI run
when one is recognisable from the usual variables (GitHub Actions, GitLab CI, Jenkins,
Buildkite). The record is what a signature covers with the files (neffcache/signing.py), so a
reader that trusts the signer trusts the record too; an unsigned record is a claim, shown as
one.

A manifest from a store is untrusted input: :meth:`Provenance.from_json` bounds every field
and refuses anything else with ``ValueError`` (the manifest parser turns it into a CORRUPT
entry's problem).
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from neffcache import __version__
from neffcache.toolchain import Toolchain

MAX_FIELD = 512  # a host name, a CI URL: short
MAX_CI_FIELDS = 8


class How(StrEnum):
    """The command that made or carried an entry."""

    WARM = "warm"
    REWARM = "rewarm"
    RUN = "run"
    PLAN = "plan"
    PUSH = "push"
    PULL = "pull"
    PREFETCH = "prefetch"
    PROMOTE = "promote"
    PUT = "put"  # NeffCache.put, the library API
    ADOPT = "adopt"  # a manifest minted for an entry a runtime wrote


# The CI run a publish belongs to, by provider: (name, branch or ref variable, run URL parts).
_CI: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("github", "GITHUB_REF", ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID")),
    ("gitlab", "CI_COMMIT_REF_NAME", ("CI_PIPELINE_URL",)),
    ("buildkite", "BUILDKITE_BRANCH", ("BUILDKITE_BUILD_URL",)),
    ("jenkins", "GIT_BRANCH", ("BUILD_URL",)),
)


@dataclass(frozen=True)
class Provenance:
    identity: str  # the signing key's id, else an index token's name, else ""
    user: str
    host: str
    how: str
    neffcache_version: str = __version__
    toolchain: Toolchain | None = None
    instance: str | None = None
    ci: Mapping[str, str] = field(default_factory=dict)  # provider, ref, run_url
    at: float = field(default_factory=time.time)
    # ``promote``: the tier it came from and the key that had signed it there (the producer's
    # fields above stay the original compile's); "" for an entry published where it was made.
    promoted_from: str = ""

    @classmethod
    def here(cls, how: How | str, *, identity: str = "", toolchain: Toolchain | None = None,
             instance: str | None = None, environ: Mapping[str, str] | None = None) -> Provenance:
        """The provenance of an entry this process makes now."""
        env = os.environ if environ is None else environ
        return cls(identity=identity[:MAX_FIELD], user=_user(env)[:MAX_FIELD], host=socket.gethostname()[:MAX_FIELD],
                   how=str(how), toolchain=toolchain, instance=instance, ci=ci_run(env))

    def to_json(self) -> dict[str, Any]:
        return {"identity": self.identity, "user": self.user, "host": self.host, "how": self.how,
                "neffcache_version": self.neffcache_version,
                "toolchain": self.toolchain.to_json() if self.toolchain else None,
                "instance": self.instance, "ci": dict(sorted(self.ci.items())), "at": self.at,
                **({"promoted_from": self.promoted_from} if self.promoted_from else {})}

    @classmethod
    def from_json(cls, data: Any) -> Provenance | None:
        """A manifest's ``provenance`` (absent: None). Raises ValueError, saying why, on anything
        a publisher does not write."""
        if data is None:
            return None
        if not isinstance(data, dict):
            raise ValueError("'provenance' must be an object")
        ci = data.get("ci") or {}
        if not isinstance(ci, dict) or len(ci) > MAX_CI_FIELDS or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_FIELD and len(v) <= MAX_FIELD
                for k, v in ci.items()):
            raise ValueError("'provenance.ci' must be an object of a few short strings")
        at = data.get("at")
        if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at <= 32503680000.0:
            raise ValueError("'provenance.at' must be a time")
        tc = data.get("toolchain")
        try:
            toolchain = Toolchain.from_json(tc) if tc is not None else None
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"'provenance.toolchain': {exc}") from None
        instance = data.get("instance")
        if instance is not None and not _short(instance):
            raise ValueError("'provenance.instance' must be a short string")
        texts = {name: data.get(name, "") for name in ("identity", "user", "host", "how", "neffcache_version",
                                                       "promoted_from")}
        bad = [name for name, value in texts.items() if not _short(value)]
        if bad:
            raise ValueError(f"'provenance.{bad[0]}' must be a short string")
        return cls(toolchain=toolchain, instance=instance, ci=dict(ci), at=float(at), **texts)

    def describe(self) -> str:
        """One line for people (``show``)."""
        who = f"{self.user}@{self.host}" + (f" as {self.identity}" if self.identity else "")
        what = f" for {self.toolchain.label}" if self.toolchain else ""
        where = f" in {self.ci.get('provider')} {self.ci.get('ref', '')} {self.ci.get('run_url', '')}".rstrip() \
            if self.ci else ""
        when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(self.at))
        via = f", promoted from {self.promoted_from}" if self.promoted_from else ""
        return f"{self.how} by {who}{what}{' on ' + self.instance if self.instance else ''}{where}, " \
               f"neffcache {self.neffcache_version}, {when}{via}"


def ci_run(environ: Mapping[str, str]) -> dict[str, str]:
    """The CI run this process belongs to (provider, ref, run URL), or {} outside CI."""
    for provider, ref_var, url_vars in _CI:
        parts = [environ.get(v, "").strip() for v in url_vars]
        ref = environ.get(ref_var, "").strip()
        if not ref and not all(parts):
            continue
        if provider == "github":
            run_url = f"{parts[0].rstrip('/')}/{parts[1]}/actions/runs/{parts[2]}" if all(parts) else ""
        else:
            run_url = parts[0]
        found = {"provider": provider, "ref": ref[:MAX_FIELD], "run_url": run_url[:MAX_FIELD]}
        return {k: v for k, v in found.items() if v}
    return {}


def _user(environ: Mapping[str, str]) -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return environ.get("USER", "") or str(os.getuid())


def _short(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_FIELD
