"""vLLM-Neuron's environment: the variables that place its two tiers, switch its cache off or
make it compile on a CPU host, and the lines that say the server is up.

Sources (docs/runtimes.md, "vLLM-Neuron"): ``compilation_cache.md`` (2026-06-22: the tiers,
``NEURON_LIBTORCH_DISABLE_COMPILE_CACHE``, ``NEURON_LIBTORCH_COMPILATION_TIMEOUT``,
``VLLM_NEURON_DISABLE_WARMUP_COMPILE``, promotion only by ``save_cache()``),
``cpu_compilation.md`` and ``cpu-development.md`` ("Remote cache workflow for production":
``VLLM_NEURON_CPU_COMPILE`` with the required ``NEURON_PLATFORM_TARGET_OVERRIDE``, never with
``VLLM_NEURON_CPU_MODE``; ``NEURON_LIBTORCH_PARALLEL_COMPILE_WORKERS``, default 8),
``setup-guide.md`` (``VLLM_CACHE_ROOT`` on local NVMe, not a network filesystem; "wait for the
server to print ``Uvicorn running on ...``"), ``quickstart-online-serving.md`` (the two ready
lines). vLLM documents no per-graph cache line: none is parsed.

Why the local tier stays off the shared store: its coordination is file locks, which the docs
call "incompatible" with NFS; sharing goes through the flat remote tier instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from neffcache.layouts.records import EnvProblem
from neffcache.stores.mounts import on_network_filesystem
from neffcache.toolchain import Toolchain

ROOT_VAR = "VLLM_CACHE_ROOT"  # the local tier: $VLLM_CACHE_ROOT/neuron/compile_cache/<hash>/
REMOTE_VAR = "NEURON_LIBTORCH_REMOTE_CACHE"  # the shared tier: flat <hash>/ directories
DISABLE_CACHE_VAR = "NEURON_LIBTORCH_DISABLE_COMPILE_CACHE"
MUST_BE_WARM_VAR = "VLLM_NEURON_DISABLE_WARMUP_COMPILE"  # a miss raises RuntimeError
CPU_COMPILE_VAR = "VLLM_NEURON_CPU_COMPILE"
CPU_MODE_VAR = "VLLM_NEURON_CPU_MODE"
TARGET_VAR = "NEURON_PLATFORM_TARGET_OVERRIDE"
WORKERS_VAR = "NEURON_LIBTORCH_PARALLEL_COMPILE_WORKERS"
# uvicorn's lines once the server has started, warm-up compiles done (the only documented output).
READY_LINES = ("Application startup complete.", "Uvicorn running on ")

FILESYSTEM_NOTE = (f"vLLM-Neuron reads its shared tier (${REMOTE_VAR}) only through a filesystem: mount "
                   "the bucket (FSx for Lustre linked to it) and give `neffcache env` the mount as --store, "
                   "or `neffcache pull` the namespace to a directory first")


def is_true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def env_notes(version_dir: str) -> list[str]:
    """What an operator should know when pointing vLLM at a namespace (``env``)."""
    return [
        f"vLLM-Neuron reads the shared tier ${REMOTE_VAR}/<hash>/ on a miss in its node-local "
        f"${ROOT_VAR}/neuron/compile_cache/; neffcache versions the shared directory ({version_dir}/)",
        "vLLM promotes to the shared tier only through save_cache(): neffcache does it (`neffcache "
        "push LOCAL_ROOT STORE`, or `neffcache warm`)",
        f"{MUST_BE_WARM_VAR}=1 makes a miss fatal (RuntimeError) instead of a compile: "
        "the runtime's own check that the fleet starts warm",
        "rewarm cannot rebuild vLLM entries: warm them with `neffcache warm -- python3 -m "
        "vllm.entrypoints.openai.api_server ...`",
    ]


def env_problems(environ: Mapping[str, str]) -> list[EnvProblem]:
    """Settings that switch vLLM's cache off, make it refuse to start, or put its tiers where
    they do not work."""
    found: list[EnvProblem] = []
    if is_true(environ.get(DISABLE_CACHE_VAR)):
        found.append(EnvProblem(DISABLE_CACHE_VAR, f"{DISABLE_CACHE_VAR}=1 turns vLLM-Neuron's compile cache off: "
                                "every process compiles every graph", f"unset {DISABLE_CACHE_VAR}"))
        if is_true(environ.get(MUST_BE_WARM_VAR)):
            found.append(EnvProblem(MUST_BE_WARM_VAR, f"{MUST_BE_WARM_VAR} is incompatible with {DISABLE_CACHE_VAR}",
                                    f"unset {DISABLE_CACHE_VAR}"))
    if is_true(environ.get(CPU_COMPILE_VAR)) and is_true(environ.get(CPU_MODE_VAR)):
        found.append(EnvProblem(CPU_COMPILE_VAR, f"{CPU_COMPILE_VAR} and {CPU_MODE_VAR} cannot be set together: "
                                "the server refuses to start", f"unset {CPU_MODE_VAR} to compile on a CPU host"))
    local = (environ.get(ROOT_VAR) or "").strip()
    fstype = on_network_filesystem(local) if local.startswith("/") else None
    if fstype is not None:
        found.append(EnvProblem(ROOT_VAR, f"{ROOT_VAR}={local} is on {fstype}: vLLM's local tier coordinates "
                                "with file locks, which network filesystems do not honour",
                                f"put {ROOT_VAR} on local disk (NVMe) and the shared cache in {REMOTE_VAR} "
                                "(neffcache env --layout vllm)"))
    remote = (environ.get(REMOTE_VAR) or "").strip()
    if "://" in remote:
        found.append(EnvProblem(REMOTE_VAR, f"{REMOTE_VAR}={remote} is a URL: vLLM reads its shared tier "
                                "through a filesystem only", "mount the bucket (FSx for Lustre linked to S3) "
                                "and point it at the mount, or `neffcache pull` to a directory"))
    return found


def compile_only_env(environ: Mapping[str, str], *, toolchain: Toolchain | None, workers: int | None
                     ) -> tuple[dict[str, str | None], list[str]]:
    """vLLM's documented CPU compile ("Remote cache workflow for production"): compile for the
    toolchain's target without a device; never together with CPU mode; the cache on; no
    must-be-warm gate (the warm-up is what fills the cache)."""
    changes: dict[str, str | None] = {CPU_COMPILE_VAR: "1"}
    notes = []
    if toolchain is not None:
        changes[TARGET_VAR] = toolchain.target
    if workers is not None:
        changes[WORKERS_VAR] = str(workers)
    for name, why in ((CPU_MODE_VAR, f"CPU inference cannot run with {CPU_COMPILE_VAR}"),
                      (DISABLE_CACHE_VAR, "the warm-up fills the cache"),
                      (MUST_BE_WARM_VAR, "a warm-up must compile its misses")):
        if name in environ:
            changes[name] = None
            notes.append(f"unset {name} for the warm-up: {why}")
    return changes, notes


def is_ready_line(line: str) -> bool:
    return any(ready in line for ready in READY_LINES)
