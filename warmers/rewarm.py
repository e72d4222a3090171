"""``neffcache rewarm``: after a compiler bump, recompile the stored HLOs with the new compiler.

Every entry keeps the HLO it was compiled from (layout A ``model.hlo_module.pb``, layout B
``hlo/ab/cd/<key>.hlo``), so the first job after an image rebuild need not pay for a single
compile. Where the new entries go is where the new runtime will look:

- layout A: ``<target dir>/neuronxcc-NEW/MODULE_<same graph hash>+<same flags hash>/``; the
  graph hash does not depend on the compiler version, so the name carries over unchanged;
- layout B: ``<target dir>/torchneuron-NEW/neff/ab/cd/<key>.neff`` with the key recomputed,
  since neffcache's key includes the compiler version.

The compile target and LNC come from the namespace's target directory (or the entry's
manifest); entries of a root the runtime filled without one need ``--instance``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from neffcache.entry import Entry, EntryState, Namespace
from neffcache.errors import ConfigError
from neffcache.ingest import read_flags
from neffcache.instances import TARGETS, lookup_instance
from neffcache.keys import cache_key
from neffcache.layouts.neuronxcc import HLO
from neffcache.layouts.torchneuron import shard
from neffcache.scan import scan
from neffcache.stores.base import Store
from neffcache.toolchain import Toolchain

from .children import Children
from .compiling import CompileJob, CompilePool, record_outcome
from .matrix import Shard
from .memory import MemoryGate
from .placement import Placement
from .report import WarmReport

log = logging.getLogger(__name__)
Progress = Callable[[str], None]
_RUNTIME_DIRS = {"neuronxcc": "neuronxcc", "torchneuron": "torchneuron"}


@dataclass
class RewarmRequest:
    from_version: str
    to_version: str
    compiler: Path
    instance: str | None = None
    lnc: int | None = None
    layouts: tuple[str, ...] = ("neuronxcc", "torchneuron")
    shard: Shard = field(default_factory=Shard)
    parallel: int = 1
    compile_timeout: float | None = None
    compile_memory_mb: float | None = None
    retry_failed: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)


def source_prefixes(req: RewarmRequest) -> list[str]:
    """Where the old compiler's namespaces can be: under each target directory, or at the root."""
    if req.instance:
        row = lookup_instance(req.instance)
        tdirs = [f"{row.target}-lnc{req.lnc or row.default_lnc}"]
    else:
        tdirs = [f"{t}-lnc{n}" for t in TARGETS for n in (1, 2)]
    out = []
    for layout in req.layouts:
        leaf = f"{_RUNTIME_DIRS[layout]}-{req.from_version}"
        out.extend([*(f"{t}/{leaf}" for t in tdirs), leaf])
    return out


def renamed_namespace(ns: Namespace, to_version: str, toolchain: Toolchain) -> Namespace:
    head, _, leaf = ns.path.rpartition("/")
    new_leaf = f"{leaf.split('-', 1)[0]}-{to_version}"
    path = f"{head}/{new_leaf}" if head else new_leaf
    return Namespace(ns.layout, path, to_version, toolchain.target, toolchain.lnc)


class Rewarmer:
    def __init__(self, req: RewarmRequest, placement: Placement, children: Children,
                 progress: Progress | None = None) -> None:
        if req.from_version == req.to_version:
            raise ConfigError(f"the installed compiler is {req.to_version} already: name the OLD version "
                              "with --from-compiler, or put the new neuronx-cc on PATH (or --compiler)")
        self.req = req
        self.placement = placement
        self.children = children
        self.progress = progress or (lambda message: None)
        self.report = WarmReport("rewarm", {"compiler_version": req.to_version, "from_compiler": req.from_version},
                                 [], [s.url for s in placement.tiers], "rewarm", req.shard.label, req.parallel)
        self.started = time.time()

    def run(self) -> WarmReport:
        started = time.monotonic()
        try:
            jobs = self._jobs()
            if jobs:
                self.progress(f"recompiling {len(jobs)} graph(s) with neuronx-cc {self.req.to_version}, "
                              f"up to {self.req.parallel} at a time")
                pool = CompilePool(self.placement, self.req.compiler, self.children, parallel=self.req.parallel,
                                   timeout=self.req.compile_timeout, memory=MemoryGate(self.req.compile_memory_mb),
                                   retry_failed=self.req.retry_failed, started_at=self.started,
                                   on_done=lambda o: self.progress(f"  {o.status:<9} {o.job.path}"
                                                                   + (f": {o.reason}" if o.reason else "")))
                for outcome in pool.run(jobs):
                    record_outcome(self.report, outcome)
            elif not self.report.notes:
                self.report.notes.append(f"no entries of neuronx-cc {self.req.from_version} in "
                                         f"{', '.join(s.url for s in self.placement.tiers)}")
        except KeyboardInterrupt:
            self.report.interrupted = True
            raise
        except Exception:
            self.children.stop_all()  # a store or index error: no compiler may outlive us
            raise
        finally:
            self.report.seconds = time.monotonic() - started
            self.report.problems.extend(self.placement.problem_notes())
        return self.report

    def _sources(self) -> dict[str, tuple[Store, Entry]]:
        """The old toolchain's entries, each once, from the fastest tier holding it."""
        wanted = {EntryState.SUCCESS} | ({EntryState.FAILED, EntryState.EMPTY} if self.req.retry_failed else set())
        found: dict[str, tuple[Store, Entry]] = {}
        for store in self.placement.tiers:
            for prefix in source_prefixes(self.req):
                for entry in scan(store, prefix=prefix, read_manifests=True).entries:
                    if entry.state in wanted and entry.path not in found:
                        found[entry.path] = (store, entry)
        return found

    def _jobs(self) -> list[CompileJob]:
        jobs: list[CompileJob] = []
        namespaces: dict[str, None] = {}
        for path, (store, entry) in sorted(self._sources().items()):
            toolchain = self._toolchain(entry)
            if toolchain is None:
                self.report.notes.append(f"{store.url}/{entry.namespace.path}: target unknown (a root the runtime "
                                         "filled); rerun with --instance to recompile it")
                continue
            hlo_name = HLO if entry.layout == "neuronxcc" else f"hlo/{shard(entry.key)}.hlo"
            if hlo_name not in entry.files:
                self.report.notes.append(f"{path}: no stored HLO, cannot be recompiled")
                continue
            flags = tuple(read_flags(store, entry))
            new_ns = renamed_namespace(entry.namespace, self.req.to_version, toolchain)
            key = entry.key if entry.layout == "neuronxcc" else self._new_key(store, entry, hlo_name, flags,
                                                                               toolchain)
            tags = {**(entry.manifest.tags if entry.manifest else {}), **self.req.tags}
            job = CompileJob(f"{entry.namespace.path} -> {new_ns.path}", new_ns, key, store,
                             entry.store_path(hlo_name), flags, toolchain, tags)
            if not self.req.shard.owns_name(job.path):
                continue
            namespaces.setdefault(new_ns.path)
            self.report.group(job.group)
            jobs.append(job)
        self.report.namespaces = list(namespaces)
        return jobs

    def _toolchain(self, entry: Entry) -> Toolchain | None:
        ns = entry.namespace
        target, lnc = ns.target, ns.lnc
        if (target is None or lnc is None) and entry.manifest and entry.manifest.toolchain:
            target, lnc = entry.manifest.toolchain.target, entry.manifest.toolchain.lnc
        if (target is None or lnc is None) and self.req.instance:
            row = lookup_instance(self.req.instance)
            target, lnc = row.target, self.req.lnc or row.default_lnc
        if target is None or lnc is None:
            return None
        return Toolchain(self.req.to_version, target, lnc)

    @staticmethod
    def _new_key(store: Store, entry: Entry, hlo_name: str, flags: tuple[str, ...], tc: Toolchain) -> str:
        # Layout B's key covers the compiler version: the new entry has a new key.
        return cache_key(store.read_bytes(entry.store_path(hlo_name)), flags, tc)
