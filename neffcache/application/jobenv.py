"""The environment a training, serving or warm-up job needs to use a neffcache-managed store.

Each runtime's variables come from its layout: the shared store's namespace
(:meth:`~neffcache.layouts.base.Layout.job_env`) and, for a runtime that keeps a node-local
tier beside it (vLLM-Neuron), a directory on this node (:meth:`~neffcache.layouts.base.Layout.node_local_env`).
A node-local tier inside the shared store is refused: it would be the shared mount the runtime's
file locks do not work on (what aws-neuron-sdk#1368's pods did); one on a network filesystem
is worth a note.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from urllib.parse import urlsplit

from neffcache.application.config import load_settings
from neffcache.errors import ConfigError
from neffcache.layouts import LAYOUTS
from neffcache.stores.mounts import on_network_filesystem
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
            environ: Mapping[str, str] | None = None, local_root: str | None = None, *,
            local_notes: bool = True) -> tuple[dict[str, str], list[str]]:
    """(variables, notes) pointing every runtime (or those of ``layouts``) at ``toolchain``'s
    namespace in the store; each layout adds what an operator should know (its notes) and what
    in ``environ`` (default: this process's) would make its runtime ignore that namespace.

    ``local_root``: the node-local directory for runtimes with a local tier (default: the
    ``local_root`` setting; ``local_notes``: say how to share what it holds). Raises
    ConfigError when it lies inside the store."""
    environ = os.environ if environ is None else environ
    root, local = runtime_root(store_url)
    env: dict[str, str] = {}
    notes: list[str] = []
    node_root: str | None = None
    for name in layouts if layouts is not None else tuple(LAYOUTS):
        layout = LAYOUTS[name]
        if layout.needs_filesystem and not local:
            notes.append(layout.filesystem_note())
            continue
        namespace = layout.namespace_for(toolchain)
        env.update(layout.job_env(root, namespace))
        if node_root is None:
            node_root = os.path.abspath(local_root if local_root is not None else load_settings().local_root)
        node_env = layout.node_local_env(node_root, namespace)
        if node_env:
            _refuse_inside(node_root, root)
            env.update(node_env)
            notes.extend(_node_notes(node_root, root) if local_notes else [])
        notes.extend(layout.env_notes(root, namespace))
        notes.extend(f"{problem.message}: {problem.fix}" for problem in layout.env_problems(environ))
    env["NEURON_LOGICAL_NC_CONFIG"] = str(toolchain.lnc)
    return env, list(dict.fromkeys(notes))


def local_tier_env(local_root: str, shared_url: str | None, toolchain: Toolchain,
                   layouts: tuple[str, ...] | None = None) -> tuple[dict[str, str], list[str]]:
    """(variables, notes) pointing every runtime at a node-local tier a prefetch filled under
    ``local_root``: a runtime with a node-local tier of its own form (vLLM-Neuron) gets it there
    (``VLLM_CACHE_ROOT``) and the shared store behind it when that is a filesystem; the others
    read the local root as their cache."""
    root = os.path.abspath(local_root)
    env: dict[str, str] = {}
    notes: list[str] = []
    shared_root, shared_local = runtime_root(shared_url) if shared_url else (None, False)
    for name in layouts if layouts is not None else tuple(LAYOUTS):
        layout = LAYOUTS[name]
        namespace = layout.namespace_for(toolchain)
        node_env = layout.node_local_env(root, namespace)
        if node_env:
            env.update(node_env)
            if shared_root is not None and shared_local:
                env.update(layout.job_env(shared_root, namespace))
        else:
            env.update(layout.job_env(root, namespace))
        notes.extend(layout.env_notes(root, namespace))
    env["NEURON_LOGICAL_NC_CONFIG"] = str(toolchain.lnc)
    return env, list(dict.fromkeys(notes))


def _refuse_inside(node_root: str, store_root: str) -> None:
    if inside(node_root, store_root):
        raise ConfigError(f"the node-local directory {node_root} is inside the shared store {store_root}: a "
                          "runtime's local tier must be on this node's own disk, not the shared mount (choose "
                          "another with --local or NEFFCACHE_LOCAL_ROOT)")


def _node_notes(node_root: str, store_root: str) -> list[str]:
    notes = [f"node-local tier under {node_root} (local disk, one per node); share what a node compiled with "
             f"`neffcache push {node_root} {store_root}`"]
    fstype = on_network_filesystem(node_root)
    if fstype is not None:
        notes.append(f"{node_root} is on {fstype}, a network filesystem: a node-local tier belongs on local "
                     "disk (NVMe), where its file locks work")
    return notes


def inside(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or below it (symlinks resolved where they exist)."""
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    return real == real_root or real.startswith(real_root.rstrip("/") + "/")


def render_env(env: Mapping[str, str], shell: str) -> str:
    if shell == "fish":
        return "\n".join(f"set -gx {k} {shlex.quote(v)};" for k, v in env.items())
    if shell == "bash":
        return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
    raise ConfigError(f"unknown shell {shell!r}; use bash, fish or json")
