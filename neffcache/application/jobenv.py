"""The environment a training or warm-up job needs to use a neffcache-managed store."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from urllib.parse import urlsplit

from neffcache.errors import ConfigError
from neffcache.layouts import LAYOUTS
from neffcache.toolchain import Toolchain


def runtime_root(store_url: str) -> tuple[str, bool]:
    """The root a runtime can be pointed at, and whether it is a local path."""
    parts = urlsplit(store_url)
    if parts.scheme in ("", "file", "fsx"):
        path = parts.path if parts.scheme else store_url
        return os.path.abspath(path), True
    if parts.scheme == "s3":
        return store_url.rstrip("/"), False
    raise ConfigError(f"the Neuron runtimes cannot read {parts.scheme}:// caches; use a local path, fsx:// or s3://")


def job_env(store_url: str, toolchain: Toolchain, layouts: tuple[str, ...] | None = None,
            environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """(variables, notes) pointing every runtime (or those of ``layouts``) at ``toolchain``'s
    namespace in the store; each layout adds what an operator should know (its notes) and what
    in ``environ`` (default: this process's) would make its runtime ignore that namespace."""
    environ = os.environ if environ is None else environ
    root, local = runtime_root(store_url)
    env: dict[str, str] = {}
    notes: list[str] = []
    for name in layouts if layouts is not None else tuple(LAYOUTS):
        layout = LAYOUTS[name]
        if layout.needs_filesystem and not local:
            notes.append(f"the {name} runtime reads a filesystem path only: mount the bucket "
                         "(FSx for Lustre linked to S3) or run `neffcache pull` first")
            continue
        namespace = layout.namespace_for(toolchain)
        env.update(layout.job_env(root, namespace))
        notes.extend(layout.env_notes(root, namespace))
        notes.extend(f"{problem.message}: {problem.fix}" for problem in layout.env_problems(environ))
    env["NEURON_LOGICAL_NC_CONFIG"] = str(toolchain.lnc)
    return env, notes


def render_env(env: Mapping[str, str], shell: str) -> str:
    if shell == "fish":
        return "\n".join(f"set -gx {k} {shlex.quote(v)};" for k, v in env.items())
    if shell == "bash":
        return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
    raise ConfigError(f"unknown shell {shell!r}; use bash, fish or json")
