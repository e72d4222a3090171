"""``neffcache rewarm``: after a compiler bump, recompile the stored HLOs with the new compiler.

Every entry keeps the HLO it was compiled from (neuronxcc ``model.hlo_module.pb``, torchneuron
``hlo/ab/cd/<key>.hlo``), so the first job after an image rebuild need not pay for a single
compile. Where the new entries go is where the new runtime will look:

- neuronxcc: ``<target dir>/neuronxcc-NEW/MODULE_<same graph hash>+<suffix>/``: the graph hash
  does not depend on the compiler version, the ``+<suffix>`` (md5 of the flags file) does
  whenever the flags file's form differs. The form of each new namespace is decided once
  (:mod:`neffcache.layouts.flags_form`) from the tiers being written, fastest first: the form
  of its newest entries there, else the version table, or ``--flags-form``; the suffix is
  recomputed under it from the user flags recovered from the old flags file, and that form's
  flags file is written (the text form with no ``model.done``: its NEFF, written last, commits
  it). The report says per namespace which form and which rule decided. An entry whose flags
  file is missing, unreadable or does not hash to its own suffix is reported, never compiled;
- torchneuron: ``<target dir>/torchneuron-NEW/neff/ab/cd/<key>.neff`` with the key recomputed,
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

from neffcache.entry import Entry, EntryState
from neffcache.errors import ConfigError
from neffcache.layouts import LAYOUTS, get_layout
from neffcache.layouts.flags_form import NamespaceForms
from neffcache.readiness import REWARMED_FROM_TAG
from neffcache.scan.report import scan
from neffcache.stores.base import Store
from neffcache.upgrades.successor import (
    renamed_namespace,
    successor_key,
    successor_toolchain,
    version_prefixes,
)

from .children import Children
from .compiling import CompileJob, CompilePool, record_outcome
from .matrix import Shard
from .memory import MemoryGate
from .placement import Placement
from .report import FailureKind, GroupStatus, WarmReport, reporting

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


@dataclass
class RewarmRequest:
    from_version: str
    to_version: str
    compiler: Path
    instance: str | None = None
    lnc: int | None = None
    layouts: tuple[str, ...] = tuple(LAYOUTS)
    shard: Shard = field(default_factory=Shard)
    parallel: int = 1
    compile_timeout: float | None = None
    compile_memory_mb: float | None = None
    retry_failed: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)
    failed_ttl: float | None = None  # a cached compiler error older than this is compiled again
    flags_form: str | None = None  # a flags form forced for the new namespaces (neuronxcc)


def source_prefixes(req: RewarmRequest) -> list[str]:
    """Where the old compiler's namespaces can be: under each target directory, or at the root."""
    return version_prefixes(req.layouts, req.from_version, instance=req.instance, lnc=req.lnc)


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
        # The new namespaces' flags forms, decided from the tiers this rewarm writes to.
        self.forms = NamespaceForms(placement.tiers, override=req.flags_form)

    def run(self) -> WarmReport:
        with reporting(self.report, stop_children=self.children.stop_all,
                       problem_notes=self.placement.problem_notes):
            jobs = self._jobs()
            if jobs:
                self._compile(jobs)
            elif not self.report.notes:
                self.report.notes.append(f"no entries of neuronx-cc {self.req.from_version} in "
                                         f"{', '.join(s.url for s in self.placement.tiers)}")
        return self.report

    def _compile(self, jobs: list[CompileJob]) -> None:
        self.progress(f"recompiling {len(jobs)} graph(s) with neuronx-cc {self.req.to_version}, "
                      f"up to {self.req.parallel} at a time")
        pool = CompilePool(self.placement, self.req.compiler, self.children, parallel=self.req.parallel,
                           timeout=self.req.compile_timeout, memory=MemoryGate(self.req.compile_memory_mb),
                           retry_failed=self.req.retry_failed, started_at=self.started,
                           on_done=lambda o: self.progress(f"  {o.status:<9} {o.job.path}"
                                                           + (f": {o.reason}" if o.reason else "")),
                           failed_ttl=self.req.failed_ttl)
        for outcome in pool.run(jobs):
            record_outcome(self.report, outcome)

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
            toolchain = successor_toolchain(entry, self.req.to_version, instance=self.req.instance, lnc=self.req.lnc)
            if toolchain is None:
                self.report.notes.append(f"{store.url}/{entry.namespace.path}: target unknown (a root the runtime "
                                         "filled); rerun with --instance to recompile it")
                continue
            hlo_name = get_layout(entry.layout).hlo_of(entry)
            if hlo_name is None:
                self.report.notes.append(f"{path}: no stored HLO, cannot be recompiled")
                continue
            new_ns = self.forms(renamed_namespace(entry.namespace, self.req.to_version, toolchain))
            group = f"{entry.namespace.path} -> {new_ns.path}"
            try:
                key, flags = successor_key(store, entry, new_ns, toolchain)
            except ValueError as exc:
                # Per entry, in the report: the runtime of the new compiler would look for a name
                # we cannot compute (or the old entry contradicts its own name).
                if self.req.shard.owns_name(path):
                    row = self.report.group(group)
                    row.graphs += 1
                    row.failed += 1
                    row.worsen(GroupStatus.FAILED)
                    row.fail(path, FailureKind.FLAGS, f"not recompiled: {exc}")
                continue
            # Which entry it was compiled from: how the index pairs the two (neffcache/readiness.py).
            tags = {**(entry.manifest.tags if entry.manifest else {}), **self.req.tags,
                    REWARMED_FROM_TAG: entry.key}
            job = CompileJob(group, new_ns, key, store, entry.store_path(hlo_name), tuple(flags), toolchain, tags)
            if not self.req.shard.owns_name(job.path):
                continue
            namespaces.setdefault(new_ns.path)
            self.report.group(job.group)
            jobs.append(job)
        self.report.namespaces = list(namespaces)
        decisions = self.forms.decisions()
        self.report.flags_forms = [d.to_json() for d in decisions]
        self.report.notes += [note for d in decisions for note in d.notes]
        return jobs
