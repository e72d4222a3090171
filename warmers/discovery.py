"""Discovery without compiling: the graphs a job will look up, from one compile-only run per bucket.

Each bucket's workload runs under the contract ``warm`` uses (:func:`~.warm.workload_env`:
``TORCH_NEURONX_COMPILE_ONLY=1``, ``NEURON_RT_FAKE_INSTANCE_TYPE``, every runtime's cache
variables pointed at the toolchain's namespaces) with two differences:

- the cache root is a **private scratch directory** (:class:`Scratch`: ``mkdtemp``, mode 0700, a
  root per bucket so each bucket's graphs are all its own), never a real store, removed when
  ``plan`` ends however it ends (Ctrl-C and errors included);
- the compiler first on PATH is the **recorder** (:mod:`.recorder`): it records each compile and
  writes a placeholder NEFF, so the runtime moves on at once. The neuronxcc runtime is also asked
  to extract its graphs only (``NEURON_EXTRACT_GRAPHS_ONLY=1``, as the two-phase warm-up does),
  which costs not even the recorder's start: its entries are left holding only their HLOs.

The runtime, finding an empty cache, looks up and stores every graph exactly where it would in
a real store, so a scan of the scratch root (the layouts, :func:`~neffcache.scan.report.scan`)
gives every entry path the job will look for. Each becomes a
:class:`~neffcache.misses.wanted.WantedGraph`, matched to its recorded compile by HLO digest:
the entry's own HLO, or, where the runtime keeps none, the digest the placeholder carries. The
flags are the runtime's flags file where it writes one, else the recorded command line's.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from neffcache.entry import Entry, Namespace
from neffcache.errors import ToolchainError
from neffcache.layouts import LAYOUTS, get_layout
from neffcache.misses.wanted import WantedGraph
from neffcache.operations.ingest import digest_of, read_flags
from neffcache.placeholder import read_placeholder
from neffcache.scan.report import scan
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.toolchain import Toolchain, parse_compiler_version

from .children import Children
from .matrix import Bucket
from .recorder import ENV_RECORDS, HLO_DIR, install_recorder, read_records
from .report import GroupReport
from .warm import WarmRequest, log_name, workload_env
from .workload import run_workload

log = logging.getLogger(__name__)
_PLACEHOLDER_HEAD = 4096


SCRATCH_PREFIX = "neffcache-plan-"
OWNER_FILE = "owner"  # host:pid of the plan that made the scratch directory


def sweep_dead_scratch(tmp: Path) -> list[Path]:
    """Remove scratch directories of plans that were killed (SIGKILL, a lost host): ours by uid,
    made on this host, whose owner process is gone. Anything else is left alone: a directory of
    another user, another host (a shared /tmp), a live plan, a link, one without an owner file;
    a reused pid only delays the sweep."""
    removed = []
    host = socket.gethostname()
    for path in tmp.glob(SCRATCH_PREFIX + "*"):
        try:
            info = path.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            owner_host, _, pid = (path / OWNER_FILE).read_text(errors="replace").strip().rpartition(":")
        except OSError:
            continue
        if owner_host != host or not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a pid we can judge: keep the directory
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Scratch:
    """The private scratch directory of one ``plan``: the recorder, a cache root and a records
    directory per bucket, the workloads' TMPDIR. Removed on exit, whatever ended the plan; the
    caller stops its children first (they write here)."""

    def __init__(self, children: Children) -> None:
        self.children = children
        sweep_dead_scratch(Path(tempfile.gettempdir()))
        self.dir = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
        os.chmod(self.dir, 0o700)
        (self.dir / OWNER_FILE).write_text(f"{socket.gethostname()}:{os.getpid()}\n")
        self.tmp = self.dir / "tmp"
        self.tmp.mkdir()
        self.recorder: Path | None = None
        self.removed = False

    def install(self, version_text: str) -> Path:
        self.recorder = install_recorder(self.dir / "bin", version_text)
        return self.recorder

    def root(self, bucket: Bucket) -> Path:
        return self.dir / f"b{bucket.index:03d}" / "cache"

    def records(self, bucket: Bucket) -> Path:
        return self.dir / f"b{bucket.index:03d}" / "records"

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.removed = not self.dir.exists()
        if not self.removed:
            log.warning("could not remove the plan's scratch directory %s", self.dir)

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None:
            self.children.stop_all()  # nothing may still write here while it goes
        self.close()


def installed_output(compiler: Path | None, timeout: float = 60.0) -> str | None:
    """What the installed ``neuronx-cc --version`` prints (stdout), or None when it cannot say."""
    if compiler is None:
        return None
    try:
        proc = subprocess.run([str(compiler), "--version"], capture_output=True, text=True, timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def version_text(toolchain: Toolchain, installed_output: str | None) -> str:
    """What the recorder answers to ``--version``: the installed compiler's own output when it is
    the toolchain's version, else the version line alone (a version named with --compiler-version)."""
    if installed_output:
        try:
            if parse_compiler_version(installed_output) == toolchain.compiler_version:
                return installed_output
        except ToolchainError:
            pass
    return f"NeuronX Compiler version {toolchain.compiler_version}\n"


@dataclass(frozen=True)
class GraphSource:
    """Where the compile pool finds a discovered graph's input: the HLO in a scratch store."""

    namespace: Namespace
    store: Store
    hlo_path: str
    flags: tuple[str, ...]


@dataclass
class BucketGraphs:
    """What one bucket's run showed: its workload's row, the graphs it looks up, their inputs."""

    bucket: Bucket
    group: GroupReport
    graphs: list[WantedGraph] = field(default_factory=list)
    sources: dict[str, GraphSource] = field(default_factory=dict)
    recorded: int = 0  # compiles the recorder saw
    unmatched: int = 0  # recorded compiles that no scratch entry holds (the runtime cached elsewhere)


def discover_bucket(req: WarmRequest, scratch: Scratch, bucket: Bucket, children: Children, *,
                    extract: bool) -> BucketGraphs:
    """Run ``bucket``'s workload against its scratch root and read what it looked up."""
    assert scratch.recorder is not None
    root, records = scratch.root(bucket), scratch.records(bucket)
    root.mkdir(parents=True)
    records.mkdir(parents=True)
    contract = dataclasses.replace(req, compiler=scratch.recorder, two_phase=extract, retry_failed=False)
    # Its notes are about pointing a real job at a store (warm and env print them): not the plan's.
    env = workload_env(contract, str(root), [])
    env.update({**bucket.env(), ENV_RECORDS: str(records), "TMPDIR": str(scratch.tmp)})
    for layout in LAYOUTS.values():  # host-local runtime state (TorchNeuron's lock dir) stays private too
        env.update(layout.private_env(str(scratch.tmp)))
    namespaces = [layout.namespace_for(req.toolchain) for layout in LAYOUTS.values()]
    run = run_workload(bucket.name, bucket.command(req.command), env, children=children, patterns=req.patterns,
                       root=str(root), namespaces=namespaces, log_path=req.log_dir / log_name(bucket),
                       timeout=req.timeout)
    found = BucketGraphs(bucket, run.group)
    if children.stopping.is_set():
        return found
    store, record_store = open_store(str(root)), open_store(str(records))
    calls = {str(c["hlo_sha256"]): c for c in read_records(records)}
    found.recorded = len(calls)
    tags = {**req.tags, **bucket.tags()}
    for entry in scan(store).entries:
        graph, source = _graph(store, record_store, entry, calls, req.toolchain, bucket, tags)
        found.graphs.append(graph)
        if source is not None:
            found.sources[graph.path] = source
    held = {g.hlo_sha256 for g in found.graphs}
    found.unmatched = sum(1 for digest in calls if digest not in held)
    return found


def _graph(store: Store, records: Store, entry: Entry, calls: Mapping[str, Mapping[str, Any]], toolchain: Toolchain,
           bucket: Bucket, tags: Mapping[str, str]) -> tuple[WantedGraph, GraphSource | None]:
    """The graph a scratch entry stands for, and where its HLO lies (None: none was kept)."""
    layout = get_layout(entry.layout)
    digest, size, source = _hlo_of(store, records, entry)
    call = calls.get(digest or "")
    flags: tuple[str, ...] | None = None
    if layout.flags_of(entry) is not None:
        flags = tuple(read_flags(store, entry))
    elif call is not None:
        flags = tuple(str(f) for f in call["flags"])
    graph = WantedGraph(path=entry.path, layout=entry.layout, namespace=entry.namespace.path, key=entry.key,
                        toolchain=entry.namespace.toolchain or toolchain, hlo_sha256=digest, hlo_size=size,
                        flags=flags, bucket=bucket.name, tags=tags)
    if source is None:
        return graph, None
    return graph, GraphSource(entry.namespace, source[0], source[1], flags or ())


def _hlo_of(store: Store, records: Store, entry: Entry) -> tuple[str | None, int | None, tuple[Store, str] | None]:
    """(digest, size, (store, path) of the HLO) of a scratch entry: its own HLO, else the copy the
    recorder kept of the HLO its placeholder names."""
    layout = get_layout(entry.layout)
    hlo = layout.hlo_of(entry)
    if hlo is not None:
        got = digest_of(store, entry.store_path(hlo))
        return got.sha256, got.size, (store, entry.store_path(hlo))
    neff = layout.neff_of(entry)
    if neff is None:
        return None, None, None
    with store.open_read(entry.store_path(neff)) as stream:
        header = read_placeholder(stream.read(_PLACEHOLDER_HEAD))
    if header is None:
        return None, None, None
    digest, size = header.get("hlo_sha256"), header.get("hlo_size")
    digest = digest if isinstance(digest, str) and len(digest) == 64 else None
    size = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
    copy = f"{HLO_DIR}/{digest}"
    return digest, size, ((records, copy) if digest and records.stat(copy) is not None else None)


def discovery_failed(groups: Sequence[GroupReport]) -> list[str]:
    """The buckets whose workload did not end well: their graphs may be incomplete."""
    return [g.name for g in groups if g.status.severity > 0]
