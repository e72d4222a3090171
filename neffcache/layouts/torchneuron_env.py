"""TorchNeuron's cache settings (the ``torchneuron`` layout): where its locks go, how long a
waiter waits, and what turns its disk cache off or changes every key it computes.

docs/runtimes.md, "torchneuron" (a public mirror of the native backend; unverified against a
release). What ``env`` and ``doctor`` say, and what a warm-up changes, all come from here.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence

from neffcache.layouts.records import EnvProblem

LOCK_TIMEOUT_VAR = "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT"
LOCK_TIMEOUT_DEFAULT = 1200  # seconds a waiter waits before it deletes the lock and retries
LOCAL_DIR_VAR = "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"
LOCAL_DIR_DEFAULT = "/tmp/local_cache"  # noqa: S108 (the runtime's default, quoted)
NEFF_DIR_VAR = "TORCH_NEURONX_NEFF_CACHE_DIR"
NEFF_DIR_DEFAULT = "/tmp/neff_cache"  # noqa: S108 (the runtime's default, quoted)
DISABLE_VAR = "TORCH_NEURONX_NEFF_DISABLE_CACHE"  # the disk cache off
FLAGS_VAR = "NEURON_CC_FLAGS"
OPT_VAR = "NEURON_COMPILER_OPT_LEVEL"
OPT_DEFAULT = "-O1"
# Part of every key the C++ writer computes: jobs that differ in them never share a NEFF.
KEY_VARS = (FLAGS_VAR, OPT_VAR)
_OPT_RE = re.compile(r"-O[0-9]\Z|--optlevel=[0-9]\Z")


def job_settings(flags: Sequence[str]) -> dict[str, str]:
    """The settings that compile a graph with ``flags``: the opt level the flags file lists
    first (``NEURON_COMPILER_OPT_LEVEL``, which the HLO tree neffcache points
    ``TORCH_NEURONX_HLO_CACHE_DIR`` at records so), the rest ``NEURON_CC_FLAGS``."""
    rest = list(flags)
    opt = rest.pop(0) if rest and _OPT_RE.match(rest[0]) else OPT_DEFAULT
    return {OPT_VAR: opt, FLAGS_VAR: shlex.join(rest)}


def notes(namespace_dir: str) -> list[str]:
    """What an operator should know when pointing TorchNeuron at ``namespace_dir``."""
    return [
        f"TorchNeuron's C++ key carries no compiler version: neffcache versions the directory "
        f"({namespace_dir}/); keep one directory per compiler",
        f"TorchNeuron's locks live on local disk, outside the cache: ${LOCAL_DIR_VAR}/locks/<key>.lock "
        f"and, for kernels, ${LOCAL_DIR_VAR}/<key>/locks/compile.lock (default {LOCAL_DIR_DEFAULT}, "
        f"flock); keep {LOCAL_DIR_VAR} off the shared mount. A waiter breaks a lock after "
        f"${LOCK_TIMEOUT_VAR} seconds (default {LOCK_TIMEOUT_DEFAULT}): a graph that compiles longer is "
        "compiled again by every waiter, so raise it for large models",
        f"{' and '.join(KEY_VARS)} are part of every key TorchNeuron computes: jobs that set them "
        "differently never share NEFFs",
    ]


def compile_only(environ: Mapping[str, str]) -> tuple[dict[str, str | None], list[str]]:
    """What a warm-up changes: a disabled disk cache would keep nothing."""
    if DISABLE_VAR in environ:
        return {DISABLE_VAR: None}, [f"unset {DISABLE_VAR}: a warm-up without the disk cache keeps nothing"]
    return {}, []


def problems(environ: Mapping[str, str]) -> list[EnvProblem]:
    """The disk cache switched off, a lock timeout that is no number of seconds, a lock
    directory on the cache itself (flock needs a local disk)."""
    found = []
    if _truthy(environ.get(DISABLE_VAR)):
        found.append(EnvProblem(DISABLE_VAR, f"{DISABLE_VAR}={environ[DISABLE_VAR]} turns TorchNeuron's disk cache "
                                "off: every graph compiles in every job", f"unset {DISABLE_VAR}"))
    timeout = environ.get(LOCK_TIMEOUT_VAR)
    if timeout is not None:
        try:
            seconds = float(timeout)
        except ValueError:
            seconds = float("nan")
        if not seconds > 0:  # NaN and infinity's negative fail here too
            found.append(EnvProblem(LOCK_TIMEOUT_VAR, f"{LOCK_TIMEOUT_VAR}={timeout!r} is not a positive number "
                                    "of seconds", f"unset it (default {LOCK_TIMEOUT_DEFAULT})"))
    local, neff_dir = environ.get(LOCAL_DIR_VAR), environ.get(NEFF_DIR_VAR)
    if local and neff_dir and _inside(local, neff_dir):
        found.append(EnvProblem(LOCAL_DIR_VAR, f"{LOCAL_DIR_VAR} ({local}) lies in the NEFF cache ({neff_dir}): "
                                "its flock files need a local disk",
                                f"point {LOCAL_DIR_VAR} at a local directory (default {LOCAL_DIR_DEFAULT})"))
    return found


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


def _inside(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or lies below it (lexically: neither need exist here)."""
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")
