"""How the SIMULATED runtime reads its environment: the real runtimes' variables, real defaults."""

from __future__ import annotations

import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

from neffcache.errors import UnknownInstanceType
from neffcache.instances import lookup_instance

# libneuronxla's documented default; only used when nothing else is configured.
DEFAULT_XLA_ROOT = Path("/var/tmp/neuron-compile-cache")  # noqa: S108
NEURON_DEVICE = Path("/dev/neuron0")
# Options of libneuronxla's cache wrapper: never passed to neuronx-cc, never hashed.
CACHE_DIR_FLAG = "--cache_dir"
RETRY_FLAG = "--retry_failed_compilation"


class WorkloadError(Exception):
    """A configuration the real runtime would refuse; the workload exits 2 with this message."""


def is_true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def resolve_instance(env: Mapping[str, str]) -> tuple[str, str, int]:
    """(instance type, compile target, LNC) from NEURON_RT_FAKE_INSTANCE_TYPE and NEURON_LOGICAL_NC_CONFIG."""
    instance = env.get("NEURON_RT_FAKE_INSTANCE_TYPE", "").strip()
    if not instance:
        if NEURON_DEVICE.exists():
            raise WorkloadError(
                "the simulation cannot use the Neuron device here; set NEURON_RT_FAKE_INSTANCE_TYPE "
                "(e.g. trn2.48xlarge) to say which instance to compile for"
            )
        raise WorkloadError(
            f"no Neuron device found ({NEURON_DEVICE} is missing) and NEURON_RT_FAKE_INSTANCE_TYPE "
            "is not set; set NEURON_RT_FAKE_INSTANCE_TYPE=<instance type> (e.g. trn2.48xlarge) "
            "to compile without a device"
        )
    try:
        row = lookup_instance(instance)
    except UnknownInstanceType as exc:
        raise WorkloadError(f"NEURON_RT_FAKE_INSTANCE_TYPE: {exc}") from None
    lnc = row.default_lnc
    raw_lnc = env.get("NEURON_LOGICAL_NC_CONFIG", "").strip()
    if raw_lnc:
        if raw_lnc not in ("1", "2"):
            raise WorkloadError(f"NEURON_LOGICAL_NC_CONFIG must be 1 or 2, not {raw_lnc!r}")
        lnc = int(raw_lnc)
    return row.name, row.target, lnc


def split_cc_flags(raw: str) -> tuple[list[str], str | None, bool]:
    """NEURON_CC_FLAGS -> (compiler flags, --cache_dir value or None, --retry_failed_compilation)."""
    try:
        tokens = shlex.split(raw)
    except ValueError as exc:
        raise WorkloadError(f"cannot parse NEURON_CC_FLAGS {raw!r}: {exc}") from None
    flags: list[str] = []
    cache_dir: str | None = None
    retry = False
    it = iter(tokens)
    for tok in it:
        if tok == RETRY_FLAG:
            retry = True
        elif tok.startswith(CACHE_DIR_FLAG + "="):
            cache_dir = tok.split("=", 1)[1]
        elif tok == CACHE_DIR_FLAG:
            cache_dir = next(it, None)
            if cache_dir is None:
                raise WorkloadError("--cache_dir in NEURON_CC_FLAGS needs a directory")
        else:
            flags.append(tok)
    return flags, cache_dir, retry


def _local_path(url: str, source: str) -> Path:
    if url.startswith("s3://"):
        raise WorkloadError(
            f"{source}={url}: S3 cache URLs are not supported by the simulation "
            "(neffcache.testing writes local layouts only; point it at a directory)"
        )
    if url.startswith("file://"):
        return Path(unquote(urlparse(url).path))
    if "://" in url:
        raise WorkloadError(f"{source}={url}: unsupported URL scheme (use a path or file:// URL)")
    return Path(url).expanduser()


def xla_cache_root(cache_dir: str | None, env: Mapping[str, str]) -> Path:
    """The neuronxcc layout's root: --cache_dir wins over NEURON_COMPILE_CACHE_URL, then the default."""
    if cache_dir:
        return _local_path(cache_dir, "--cache_dir").absolute()
    url = env.get("NEURON_COMPILE_CACHE_URL", "").strip()
    if url:
        return _local_path(url, "NEURON_COMPILE_CACHE_URL").absolute()
    return DEFAULT_XLA_ROOT


def native_dirs(env: Mapping[str, str]) -> tuple[Path, Path | None, Path]:
    """The torchneuron layout's (NEFF dir, HLO dir or None, local dir for locks)."""
    neff = env.get("TORCH_NEURONX_NEFF_CACHE_DIR", "").strip()
    if not neff:
        raise WorkloadError(
            "the native backend needs TORCH_NEURONX_NEFF_CACHE_DIR (the NEFF cache directory)"
        )
    hlo = env.get("TORCH_NEURONX_HLO_CACHE_DIR", "").strip()
    local = env.get("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", "").strip()
    local_dir = Path(local) if local else Path(tempfile.gettempdir()) / "torch-neuronx-neff-local-cache"
    return Path(neff).absolute(), Path(hlo).absolute() if hlo else None, local_dir.absolute()
