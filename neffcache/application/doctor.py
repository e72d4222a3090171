"""``neffcache doctor``: check a host as a job would use it, before a job finds out the hard way.

Each check yields one :class:`Finding` (ok, warning or problem, with the fix). The checks only
read, except one: a store's writability is tested by a real write and delete of a small file
under the store's control directory, because permissions, read-only mounts, quotas and S3
policies can only be known by trying (a mode bit says nothing about an S3 bucket policy or an
NFS export).

Clock skew matters because leases carry absolute expiry times written by one host and judged
by another: a host whose clock runs 10 minutes ahead takes over every lease early. The skew
of a store is measured from the modification time it gives the file we just wrote (the
server's clock on NFS/Lustre/S3); the index's from its HTTP ``Date`` header.
"""

from __future__ import annotations

import email.utils
import errno
import os
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from neffcache.application.findings import DoctorReport, Finding, Level
from neffcache.application.jobenv import inside, job_env, runtime_root
from neffcache.errors import (
    AccessDenied,
    CompilerNotFound,
    NeffcacheError,
    ReadOnlyStore,
    StoreUnavailable,
    ToolchainError,
    UnsafePath,
)
from neffcache.instances import lookup_instance
from neffcache.layouts import LAYOUTS
from neffcache.stores import open_store
from neffcache.stores.base import CONTROL_DIR, Store
from neffcache.stores.local_listing import native_listing
from neffcache.stores.mounts import filesystem_type, is_network_filesystem
from neffcache.toolchain import TARGET_DIRS, Toolchain, compiler_version, find_compiler
from neffcache.units import human_bytes

DOCTOR_DIR = f"{CONTROL_DIR}/doctor"
# Leases last minutes (publish 300 s, compile leases longer): a skew of a good part of that
# makes hosts take each other's leases over early. S3 and most servers stamp whole seconds.
SKEW_WARNING_SECONDS = 5.0
SKEW_PROBLEM_SECONDS = 60.0
FREE_WARNING_BYTES = 5 * 1024**3
FREE_WARNING_SHARE = 0.05


@dataclass
class DoctorRequest:
    instance: str | None = None
    lnc: int | None = None
    compiler: str | None = None
    stores: Sequence[str] = ()
    index_url: str | None = None
    token: str | None = None
    store_options: Mapping[str, Any] = field(default_factory=dict)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


# -- the checks ------------------------------------------------------------------------------

def check_compiler(req: DoctorRequest) -> tuple[list[Finding], str | None]:
    """``neuronx-cc`` found and its version (a CPU host without it can still push/pull/prune)."""
    try:
        path = find_compiler(req.compiler)
        version = compiler_version(path)
    except CompilerNotFound:
        return [Finding("compiler", Level.WARNING, "neuronx-cc not found: warm, rewarm and env need it",
                        "install the Neuron SDK (or pass --compiler PATH); to rehearse without it put the "
                        "simulated toolchain first on PATH: python -m neffcache.testing.shim DIR")], None
    except ToolchainError as exc:
        return [Finding("compiler", Level.PROBLEM, str(exc), "check the Neuron SDK installation")], None
    return [Finding("compiler", Level.OK, f"neuronx-cc {version} at {path}")], version


def check_instance(req: DoctorRequest, version: str | None) -> tuple[list[Finding], Toolchain | None]:
    if not req.instance:
        return [Finding("instance", Level.WARNING, "no instance type given: the toolchain checks are skipped",
                        "pass --instance (e.g. trn2.48xlarge) or set NEFFCACHE_INSTANCE")], None
    try:
        row = lookup_instance(req.instance)
    except NeffcacheError as exc:
        return [Finding("instance", Level.PROBLEM, str(exc), "use an instance type of `neffcache env --help`")], None
    lnc = req.lnc or row.default_lnc
    found = [Finding("instance", Level.OK, f"{req.instance}: target {row.target}, LNC {lnc}")]
    runtime_lnc = req.environ.get("NEURON_LOGICAL_NC_CONFIG")
    if runtime_lnc and runtime_lnc != str(lnc):
        found.append(Finding("lnc", Level.PROBLEM,
                             f"NEURON_LOGICAL_NC_CONFIG={runtime_lnc} but NEFFs are compiled for LNC {lnc}: "
                             "the runtime cannot load them", f"compile with --lnc {runtime_lnc}, or unset it"))
    return found, Toolchain(version, row.target, lnc) if version else None


def check_store(url: str, req: DoctorRequest, *, clock: Callable[[], float] = time.time) -> list[Finding]:
    """Reachable, writable (a real write and delete), its filesystem, free space, clock skew."""
    check = f"store {url}"
    try:
        store = open_store(url, create=False, **req.store_options)
    except NeffcacheError as exc:
        return [Finding(check, Level.PROBLEM, f"cannot open: {exc}", "check the URL, the mount and credentials")]
    try:
        return [*_probe_write(store, check, clock), *_filesystem(store, check)]
    except StoreUnavailable as exc:
        return [Finding(check, Level.PROBLEM, f"unreachable: {exc}", "check the mount, network and credentials")]
    except UnsafePath as exc:
        return [Finding(check, Level.PROBLEM, f"unsafe: {exc}",
                        "remove the symlink below the store root (neffcache never follows one)")]
    finally:
        store.close()


def _probe_write(store: Store, check: str, clock: Callable[[], float]) -> list[Finding]:
    path = f"{DOCTOR_DIR}/{_safe_host()}-{os.getpid()}-{secrets.token_hex(4)}"
    payload = b"neffcache doctor write test\n"
    before = clock()
    try:
        store.put_file(path, payload)
    except (AccessDenied, ReadOnlyStore) as exc:
        return [Finding(check, Level.PROBLEM, f"not writable: {exc}",
                        "mount it read-write, fix its permissions or policy, or use it as a read-only tier")]
    except (NeffcacheError, OSError) as exc:
        if _refused(exc):
            return [Finding(check, Level.PROBLEM, f"not writable: {exc}",
                            "mount it read-write or fix its permissions, or use it as a read-only tier")]
        return [Finding(check, Level.PROBLEM, f"a test write failed: {exc}", "check free space and permissions")]
    after = clock()
    found: list[Finding] = []
    try:
        info = store.stat(path)
        back = store.read_bytes(path)
        if back != payload:
            found.append(Finding(check, Level.PROBLEM, "a test file read back different bytes",
                                 "the store does not return what was written: check the mount or endpoint"))
        else:
            found.append(Finding(check, Level.OK, "reachable and writable (test write, read and delete)"))
        if info is not None:
            found.append(_skew(check, info.mtime, before, after))
    finally:
        try:
            store.delete([path])
        except (NeffcacheError, OSError) as exc:
            found.append(Finding(check, Level.WARNING, f"could not delete the test file {path}: {exc}",
                                 "the store lets us write but not delete: prune will fail there"))
    return found


def _refused(exc: BaseException | None) -> bool:
    """True when the write failed because the filesystem or its permissions refuse writes."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return True
        exc = exc.__cause__
    return False


def _skew(check: str, server_time: float, before: float, after: float) -> Finding:
    # The server stamped the file somewhere between our two readings (whole seconds on S3).
    if before - 1.0 <= server_time <= after + 1.0:
        return Finding(f"{check} clock", Level.OK, "clock agrees with this host's")
    skew = server_time - after if server_time > after else server_time - before
    return _skew_finding(f"{check} clock", skew, "the store's")


def _skew_finding(check: str, skew: float, whose: str) -> Finding:
    text = f"{whose} clock is {abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} this host's"
    fix = "sync clocks (chrony/NTP): leases carry absolute expiry times that other hosts judge"
    if abs(skew) >= SKEW_PROBLEM_SECONDS:
        return Finding(check, Level.PROBLEM, text, fix)
    if abs(skew) >= SKEW_WARNING_SECONDS:
        return Finding(check, Level.WARNING, text, fix)
    return Finding(check, Level.OK, text)


def _filesystem(store: Store, check: str) -> list[Finding]:
    probe = store.local_path(DOCTOR_DIR)
    if probe is None:
        return []
    local = probe
    while not local.exists() and local != local.parent:
        local = local.parent
    found = []
    fstype = filesystem_type(local)
    if is_network_filesystem(fstype):
        found.append(Finding(f"{check} filesystem", Level.OK,
                             f"on {fstype}: shared-mount rules apply (lease files with owner and expiry; "
                             "flock is not trusted there and is never used)"))
    else:
        found.append(Finding(f"{check} filesystem", Level.OK, f"on {fstype or 'an unknown filesystem'} (local)"))
    try:
        usage = shutil.disk_usage(local)
    except OSError:
        return found
    free = f"{human_bytes(usage.free)} free of {human_bytes(usage.total)}"
    if usage.free < FREE_WARNING_BYTES or usage.free < usage.total * FREE_WARNING_SHARE:
        found.append(Finding(f"{check} space", Level.WARNING, free,
                             "prune it (neffcache prune --max-size SIZE) or grow the volume: NEFFs reach "
                             "hundreds of MB"))
    else:
        found.append(Finding(f"{check} space", Level.OK, free))
    return found


def check_index(req: DoctorRequest, *, client: Any = None, clock: Callable[[], float] = time.time) -> list[Finding]:
    """The index reachable, the token's scope, and the server's clock."""
    if not req.index_url:
        return [Finding("index", Level.OK, "no index server configured: reports stay local (optional)")]
    headers = {"Authorization": f"Bearer {req.token}"} if req.token else {}
    http = client or httpx.Client(base_url=req.index_url.rstrip("/"), timeout=5.0)
    try:
        before = clock()
        reply = http.get("/v1/whoami", headers=headers)
        after = clock()
    except httpx.HTTPError as exc:
        return [Finding("index", Level.WARNING, f"{req.index_url} unreachable: {exc}",
                        "start it (neffcache serve) or fix --index-url; until then reports wait in the "
                        "spool (neffcache flush)")]
    finally:
        if client is None:
            http.close()
    found = []
    if reply.status_code == 401:
        found.append(Finding("index token", Level.PROBLEM, f"{req.index_url} rejects the token (401)",
                             "set NEFFCACHE_TOKEN to a valid token (neffcache token create ...)"))
    elif reply.status_code >= 400:
        found.append(Finding("index", Level.PROBLEM, f"{req.index_url} answered {reply.status_code}",
                             "check the URL points at a neffcache index server"))
    else:
        try:
            who = reply.json()
            scope, name = str(who.get("scope")), str(who.get("name"))
        except (ValueError, AttributeError):
            return [Finding("index", Level.PROBLEM, f"{req.index_url} is not a neffcache index server",
                            "check --index-url")]
        if scope in ("write", "admin"):
            found.append(Finding("index token", Level.OK, f"reachable; token {name!r} may write ({scope})"))
        else:
            found.append(Finding("index token", Level.WARNING,
                                 f"reachable, but token {name!r} has scope {scope!r}: reports will be refused (403)",
                                 "use a token with write scope (neffcache token create NAME --scope write)"))
    date = reply.headers.get("date")
    if date:
        try:
            server = email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            return found
        # HTTP dates have whole seconds: anything within the request's span and 1 s is agreement.
        if not before - 1.0 <= server <= after + 1.0:
            skew = server - after if server > after else server - before
            found.append(_skew_finding("index clock", skew, "the index server's"))
        else:
            found.append(Finding("index clock", Level.OK, "clock agrees with this host's"))
    return found


def check_environment(req: DoctorRequest, toolchain: Toolchain | None) -> list[Finding]:
    """The cache variables a job would run with: overrides and unversioned directories."""
    env = req.environ
    found: list[Finding] = []
    for layout in LAYOUTS.values():
        found.extend(Finding(f"env {problem.variable}", Level.WARNING, problem.message, problem.fix)
                     for problem in layout.env_problems(env))
    found.extend(_node_tiers_in_stores(req))
    wanted = _wanted_env(req, toolchain)
    for name in sorted(_cache_variables()):
        value = env.get(name)
        if value is None:
            continue
        if name in wanted and value != wanted[name]:
            found.append(Finding(f"env {name}", Level.WARNING, f"{name}={value}, but neffcache manages {wanted[name]}",
                                 'eval "$(neffcache env --instance ... --store ...)"'))
        elif not _versioned(value):
            found.append(Finding(f"env {name}", Level.WARNING,
                                 f"{name}={value} is not versioned by target and LNC: NEFFs of trn1 and trn2 "
                                 "hosts (and, for caches whose keys carry no compiler version, of two "
                                 "compilers) can be served to the wrong job",
                                 'point it at a directory neffcache manages: eval "$(neffcache env ...)"'))
        else:
            found.append(Finding(f"env {name}", Level.OK, f"{name}={value}"))
    if not found:
        found.append(Finding("env", Level.OK, "no cache variables set: `neffcache run`/`env` will set them"))
    return found


def _cache_variables() -> set[str]:
    """Every variable a layout sets to point its runtime at a cache (asked of the layouts)."""
    probe = Toolchain("1.0.0.0", "trn2", 2)
    names: set[str] = set()
    for layout in LAYOUTS.values():
        names.update(layout.job_env("/probe", layout.namespace_for(probe)))
    return names


def _node_tiers_in_stores(req: DoctorRequest) -> list[Finding]:
    """A runtime's node-local tier (vLLM's local cache) pointed into a shared store: the runtime's
    file locks on a shared mount, and pods that still compile on cold start (aws-neuron-sdk#1368)."""
    probe = Toolchain("1.0.0.0", "trn2", 2)
    names = {n for lay in LAYOUTS.values() for n in lay.node_local_env("/probe", lay.namespace_for(probe))}
    roots = [runtime_root(s)[0] for s in req.stores if "://" not in s or s.startswith(("file://", "fsx://"))]
    found = []
    for name in sorted(names):
        value = req.environ.get(name, "").strip()
        for store in [r for r in roots if value and inside(value, r)][:1]:
            found.append(Finding(f"env {name}", Level.WARNING, f"{name}={value} is inside the shared store {store}: "
                                 "it is the runtime's node-local tier, whose file locks a shared mount does not "
                                 "honour; pods read the shared store through the runtime's remote tier instead",
                                 'eval "$(neffcache env ...)": a directory on local disk for it, the store as the '
                                 "runtime's shared tier"))
    return found


def _wanted_env(req: DoctorRequest, toolchain: Toolchain | None) -> dict[str, str]:
    local = [s for s in req.stores if "://" not in s or s.startswith(("file://", "fsx://"))]
    if toolchain is None or not local:
        return {}
    try:
        return job_env(local[0], toolchain, tuple(LAYOUTS))[0]
    except NeffcacheError:
        return {}


def _versioned(value: str) -> bool:
    return any(part in TARGET_DIRS for part in value.rstrip("/").split("/"))


def _safe_host() -> str:
    host = socket.gethostname() or "host"
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in host)[:64]


def check_native() -> Finding:
    """Whether local scans list in C. Off on purpose (``NEFFCACHE_NATIVE=0``) is fine; missing is a
    warning, since the optional build goes on silently where there is no compiler."""
    state = native_listing()
    if state.active or state.chosen:
        return Finding("native listing", Level.OK, state.describe())
    return Finding("native listing", Level.WARNING, f"{state.describe()}: local scans list files about 3x slower",
                   "install gcc and the Python headers (python3-dev), then reinstall neffcache")


def diagnose(req: DoctorRequest, *, on_finding: Callable[[Finding], None] | None = None) -> DoctorReport:
    """Run every check; ``on_finding`` sees each finding as it is made (progress)."""
    findings: list[Finding] = []

    def add(items: Iterable[Finding]) -> None:
        for item in items:
            findings.append(item)
            if on_finding is not None:
                on_finding(item)

    compiler_findings, version = check_compiler(req)
    add(compiler_findings)
    instance_findings, toolchain = check_instance(req, version)
    add(instance_findings)
    if not req.stores:
        add([Finding("stores", Level.WARNING, "no store given: nothing to check",
                     "pass --store URL (repeatable) or set NEFFCACHE_STORES")])
    for url in req.stores:
        add(check_store(url, req))
    add(check_index(req))
    add(check_environment(req, toolchain))
    add([check_native()])
    return DoctorReport(tuple(findings))
