"""What every layout knows: how a runtime arranges entries under a cache root."""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.layouts.envparts import RuntimeEnv
from neffcache.layouts.keyparts import KeyQuestions
from neffcache.layouts.records import (
    DirectoryRole,
    EntryNames,
    EntryPlan,
    FailureLog,
    Located,
    LogLine,
    ShardDir,
)
from neffcache.manifest import Manifest
from neffcache.stores.base import TEMP_MARKER
from neffcache.toolchain import Toolchain

# The layout of caches most fleets have today (libneuronxla's): the default where none is named.
DEFAULT_LAYOUT = "neuronxcc"
# The layout NeffCache.get/put keep entries in, keyed by neffcache's own key function.
KEYED_LAYOUT = "torchneuron"


class Layout(KeyQuestions, RuntimeEnv, ABC):
    """How one runtime arranges entries under a root: every runtime fact has its home here
    (what its keys are made of: :class:`~neffcache.layouts.keyparts.KeyQuestions`; the settings
    a job runs it with: :class:`~neffcache.layouts.envparts.RuntimeEnv`).

    Code outside ``neffcache/layouts/`` never names a runtime's files or tests a layout's name:
    it asks the layout (a test in tests/layouts/test_knowledge_stays_in_layouts.py enforces it).
    """

    name: str
    runtime_dir: str  # the leaf directory prefix of a namespace: ``<runtime_dir>-<version>``
    needs_filesystem: bool = False  # True: the runtime reads only a local or mounted directory
    # True when the runtime's log lines do not say which entries it compiled (they name no
    # entry, or there are none): a run's compiles are the entries it added to the cache.
    counts_from_cache: bool = False

    @abstractmethod
    def namespace_for(self, toolchain: Toolchain) -> Namespace:
        """The namespace neffcache manages for ``toolchain`` (target directory included)."""

    @abstractmethod
    def locate(self, path: str) -> Located | None:
        """Which entry a store-relative file path belongs to, or None if not this layout's."""

    @abstractmethod
    def classify(
        self, located: Located, files: Mapping[str, FileInfo], manifest: Manifest | None,
        manifest_error: str | None = None,
    ) -> Entry:
        """Build the entry and its state from the files the listing found."""

    @staticmethod
    def entry_at(located: Located, files: Mapping[str, FileInfo], state: EntryState, problems: list[str],
                 manifest: Manifest | None, *, manifest_name: str, marker_name: str, committed: bool = True,
                 extra: tuple[str, ...] = ()) -> Entry:
        """The entry ``classify`` decided on, where ``located`` says it lies."""
        return Entry.listed(located.namespace, located.key, located.path, located.base, dict(files), state,
                            tuple(problems), manifest, manifest_name, marker_name, extra, committed)

    @abstractmethod
    def plan_entry(self, namespace: Namespace, key: str) -> EntryPlan:
        """Where a writer puts an entry of ``key`` in ``namespace``."""

    # True for a layout whose entries may lie at more than one path (:meth:`entry_paths`).
    has_other_forms: bool = False

    def entry_paths(self, namespace: Namespace, key: str) -> tuple[str, ...]:
        """Every path at which this runtime's readers find entry ``key`` of ``namespace``, the
        writer's (:meth:`plan_entry`) first: one entry, whichever of them holds it (vLLM's
        shared tier is flat, its local tier is not). Default: the writer's alone."""
        return (self.plan_entry(namespace, key).path,)

    def runtime_local_path(self, namespace: Namespace, key: str) -> str | None:
        """For a runtime with a node-local tier of its own form (:meth:`node_local_env`): the
        path of entry ``key`` of ``namespace`` in that tier, relative to the local root. None
        (the default): the runtime has no such tier."""
        return None

    def publish_plan(self, namespace: Namespace, key: str, names: Collection[str], *, local: bool = False
                     ) -> EntryPlan:
        """:meth:`plan_entry` for a publish of the files ``names``: a layout whose commit marker
        depends on the files' own form (neuronxcc's text form) says so here; by default the plan.
        ``local``: into a node-local tier, at :meth:`runtime_local_path` where the runtime has
        one (vLLM's ``neuron/compile_cache/<hash>``), the same names below it."""
        plan = self.plan_entry(namespace, key)
        at = self.runtime_local_path(namespace, key) if local else None
        return plan if at is None else dataclasses.replace(plan, path=at, base=at)

    @abstractmethod
    def job_env(self, root: str, namespace: Namespace) -> dict[str, str]:
        """The environment a runtime needs to use ``namespace`` under the local path ``root``."""

    @abstractmethod
    def write_order(self, names: list[str], marker: str, manifest: str) -> list[str]:
        """Names in the order a publisher writes them: manifest, data, then the marker."""

    def data_before_manifest(self, names: list[str]) -> list[str] | None:
        """The data ``names`` in an order a publisher may write them *before* the manifest (when
        the manifest is computed from what it sends): the first one's presence alone must read
        as uncommitted, never as an entry of another state. None when no file of this layout
        does (the default): the manifest must then come first."""
        return None

    # -- names of an entry's files --------------------------------------------------------------
    @abstractmethod
    def names(self, namespace: Namespace, key: str) -> EntryNames:
        """The names a writer gives the files of entry ``key`` in ``namespace`` (current era)."""

    def version_dir(self, compiler_version: str) -> str:
        """The namespace leaf directory of ``compiler_version`` (``neuronxcc-2.27...``)."""
        return f"{self.runtime_dir}-{compiler_version}"

    def hlo_of(self, entry: Entry) -> str | None:
        """The name of the entry's HLO (what a recompile starts from), if it has one."""
        name = self.names(entry.namespace, entry.key).hlo
        return name if name is not None and name in entry.files else None

    def flags_of(self, entry: Entry) -> str | None:
        """The name of the entry's compiler-flags file, if it has one."""
        name = self.names(entry.namespace, entry.key).flags
        return name if name is not None and name in entry.files else None

    def neff_of(self, entry: Entry) -> str | None:
        """The name of the entry's NEFF, if it has one."""
        name = self.names(entry.namespace, entry.key).neff
        return name if name is not None and name in entry.files else None

    def failure_log_of(self, entry: Entry) -> str | None:
        """The name of the runtime's record of a failed compile, if the entry has one."""
        name = self.names(entry.namespace, entry.key).failure_log
        return name if name is not None and name in entry.files else None

    def read_failure_log(self, data: bytes) -> FailureLog:
        """What the failure log's bytes ``data`` say (the runtime's own form; by default the
        compiler's text as it is)."""
        return FailureLog(None, data.decode(errors="replace"))

    def failure_log_bytes(self, command: Sequence[str], output: str) -> bytes:
        """The failure log a writer records for a compile that ran ``command`` and printed
        ``output``, in the runtime's own form (by default the text alone)."""
        return output.encode()

    def locks_of(self, entry: Entry) -> tuple[str, ...]:
        """Names of the runtime's lock files present in the entry (none by default)."""
        return ()

    def payload_names(self, entry: Entry) -> frozenset[str]:
        """The runtime files a manifest of this entry must cover (its NEFF, its marker)."""
        neff = self.names(entry.namespace, entry.key).neff
        return frozenset({neff} if neff else ())

    def transferable_names(self, entry: Entry) -> list[str]:
        """The files that make up an entry: no locks, no temp files, not the manifest."""
        skip = {entry.manifest_name, *self.locks_of(entry)}
        return sorted(n for n in entry.files if n not in skip and TEMP_MARKER not in n)

    def raw_copy_order(self, entry: Entry) -> list[str]:
        """Transferable names in the order a copy of an entry *without* manifest (FAILED,
        EMPTY) writes them: the failure log before the HLO and the HLO last, so a half copy
        never reads as an EMPTY entry a runtime would pick up and compile; the commit marker,
        if any, strictly last."""
        names = self.transferable_names(entry)
        own = self.names(entry.namespace, entry.key)
        return sorted(names, key=lambda n: (n == entry.marker_name, n == own.hlo, n == own.failure_log, n))

    def state_anchor(self, entry: Entry) -> str | None:
        """The file whose presence defines what readers see of a manifest-less entry (its
        marker by default): copied last, removed last."""
        return entry.marker_name if entry.marker_name in entry.files else None

    def removal_phases(self, entry: Entry) -> list[list[str]]:
        """An entry's names in removal phases, each phase removed before the next starts.

        Entries neffcache published go in the publish order reversed: locks and the commit
        marker, the blobs, then the manifest, whose presence keeps the remains reading as
        uncommitted (absent). Entries a runtime wrote have no manifest: locks and marker first
        and the file that defines what readers see (:meth:`state_anchor`) last, so a
        half-removed entry never reads as a different entry (an EMPTY one a runtime would
        pick up, say).
        """
        names = set(entry.files)
        locks = sorted(self.locks_of(entry))
        marker = entry.marker_name if entry.marker_name in names else None
        anchor: str | None
        if entry.manifest_name in names:
            anchor = entry.manifest_name
            first = [*locks, *([marker] if marker else [])]
        else:
            anchor = self.state_anchor(entry)
            first = [*locks, *([marker] if marker and marker != anchor else [])]
        rest = sorted(names - set(first) - {anchor})
        phases = [first, rest, [anchor] if anchor else []]
        return [phase for phase in phases if phase]

    # -- the flags file ---------------------------------------------------------------------
    def flags_file(self, namespace: Namespace, key: str, flags: Sequence[str]) -> tuple[str | None, bytes]:
        """(name, bytes) of the flags file a writer gives entry ``key`` of ``namespace``: the
        runtime's own form where the runtime's key depends on it (neuronxcc). Default: a JSON
        list under :meth:`names`' flags name."""
        return self.names(namespace, key).flags, json.dumps(list(flags)).encode()

    def read_user_flags(self, name: str, data: bytes) -> list[str]:
        """The compiler flags a flags file named ``name`` holds. Raises ValueError when it is
        not one this layout writes."""
        value = json.loads(data)
        if not isinstance(value, list) or not all(isinstance(f, str) for f in value):
            raise ValueError(f"{name} is not a JSON list of strings")
        return value

    def stated_flags(self, name: str, data: bytes) -> list[str]:
        """The flags a flags file records, as the compiler was given them (with a ``--target``
        the file keeps apart: neuronxcc's target form). Default: :meth:`read_user_flags`."""
        return self.read_user_flags(name, data)

    def flags_problem(self, key: str, data: bytes | None) -> str | None:
        """Why entry ``key`` must not be compiled from its flags file (``data``; None when it
        has none): its key says other flags. None when it may (the default: no rule)."""
        return None

    def key_for(self, key: str, name: str, data: bytes, namespace: Namespace) -> tuple[str, str, bytes] | None:
        """(key, flags name, flags bytes) the runtime of ``namespace`` gives the graph of entry
        ``key`` whose flags file ``name`` holds ``data``, when the layout can derive it from
        the entry (neuronxcc: the MODULE name); None when it cannot (the caller keys by content).
        Raises ValueError when the entry contradicts itself."""
        return None

    def key_from_content(self, key: str, read: Callable[[str], bytes]) -> str:
        """The key entry ``key`` has by its own bytes (``read(name)`` gives a file's), for a layout
        whose directory is named by a hash of a file in it (NxDI's config hash): ``key`` itself,
        or the one its content gives when ``key`` is empty (a root that names none). Raises
        ValueError when the content contradicts the name. Default: ``key``, nothing read."""
        return key

    def entry_named(self, path: str) -> str | None:
        """The entry (its name inside a namespace) a printed path names wherever it lies (layout
        A: ``.../model.MODULE_<g>+<f>.hlo_module.pb`` in a compile work directory), or None."""
        return None

    def parse_log_lines(self, line: str) -> list[LogLine]:
        """Everything ``line`` says: :meth:`parse_log_line`, with a line that means two things
        (neuronxcc's compiler call: a miss and a compile) as two."""
        found = self.parse_log_line(line)
        return [] if found is None else [found]

    def parse_log_line(self, line: str) -> LogLine | None:
        """What ``line`` of this runtime's output says, or None when it is not one of its
        cache lines."""
        return None

    def prune_group_dir(self, entry_path: str) -> str | None:
        """The directory whose entries share prune-group leases with the entry at ``entry_path``
        (coordination/write_leases.py), when it is not the entry's parent directory (torchneuron:
        the NEFF tree above its shard or kernel directory, which holds one or two entries at
        scale); None when this layout has no such rule for the path (the parent is used)."""
        return None

    def runtime_debris_after(self, path: str) -> float | None:
        """For a runtime file (:meth:`is_runtime_file`) that a dead writer may leave behind (a
        temp file): seconds after its mtime when it is surely debris; None: never ours to judge."""
        return None

    def is_runtime_file(self, path: str) -> bool:
        """True for a store-relative path outside any entry that the runtime itself keeps
        (neuronxcc's root ``lock``): neither an entry nor garbage."""
        return False

    # Payload names manifests of minor revision < 2 did not cover (written before neffcache knew
    # them as the runtime's: neuronxcc's wrapped_neff.hlo); a transfer completes such a manifest.
    late_payload: frozenset[str] = frozenset()

    # -- finding entries and what is not theirs -------------------------------------------------
    # True when an entry is one directory of its own (its ``base``): listing that directory
    # finds all its files. False when entries share a directory (torchneuron's shards).
    entry_is_dir: bool = False

    # Layouts whose entries spread their files over sibling trees under a namespace, the same
    # shard path in each (torchneuron: ``<ns>/neff/ab/cd`` and ``<ns>/hlo/ab/cd``): their names.
    # A walk reaches the two far apart; a summary lists them in step instead (scan/summary.py).
    spread_trees: tuple[str, ...] = ()

    def directory_role(self, directory: str, namespaces: dict[str, Namespace | None] | None = None
                       ) -> DirectoryRole | None:
        """What ``directory`` (a store path) is to this layout, or None: nothing (the default).
        A scan asks each layout once per directory, so a layout decides cheaply, from the last
        name, which of the questions can apply before it runs a regex. What each answer vouches for:

        - ``entry``: the entry whose directory ``directory`` is (name left empty), for a layout
          whose entries are directories (:attr:`entry_is_dir`): a scan resolves each directory
          once, not each file. ``flat``: the entry's files are exactly those directly in it.
        - ``shard``: ``directory`` resolved once for its files, for a layout whose entries are
          files that share directories (torchneuron's shards).
        - ``spread_of``: the namespace directory of which ``directory`` is one of the
          :attr:`spread_trees` (``<ns>/neff`` -> ``<ns>``).
        - ``entries_below``: a rule by which a walk may count the entries among the children
          of ``directory`` without listing them. Each child the rule covers must be an entry of
          the rule's namespace (``entry``), and one whose files the rule accepts must be what
          :meth:`classify`, given the files alone (no manifest, no problem), makes a committed
          SUCCESS entry with nothing foreign, its size the sum of the files'.
        - ``shards_below``: a rule by which a listing may count the children of ``directory``
          without listing them, for this tree alone (``primary_dirs``: ``directory`` when its
          children hold the primary files, else empty): for each child it names, counting by
          the rule must give what :meth:`plain_entries` gives of the child's listings, and each
          child must be a shard directory (``shard``) of the rule's namespace. A level listed in
          step in the :attr:`spread_trees` counts by the merge of its trees' answers
          (scan/grouping.py, ``merged_shards_below``).

        ``namespaces`` caches answers across calls, so the entries of a namespace share one
        Namespace: this layout's own (a caller keeps one per layout, since layouts key it by
        paths alike), which it may also use under keys no path can be (TorchNeuron's per parent
        directory, behind a NUL). A cache only: callers never read it."""
        return None

    def plain_entries(self, shards: Sequence[tuple[ShardDir, Sequence[str], Sequence[FileInfo]]]
                      ) -> tuple[int, int] | None:
        """(entries, bytes) of every entry whose files are listed in ``shards`` (the listings of
        one shard path in each of the :attr:`spread_trees`, with no problems and no temp file),
        when :meth:`classify`, given no manifest, would make each of them a committed SUCCESS
        entry with nothing foreign; None when any would be anything else, or when this layout
        cannot tell (the default). A summary counts such a shard without building its entries
        (scan/summary.py); on None it builds them."""
        return None

    def locate_entry(self, path: str) -> Located | None:
        """The entry whose :attr:`Entry.path` is ``path`` (name left as the layout's probe), or
        None when ``path`` is not an entry path of this layout."""
        return None

    def namespace_version(self, path: str) -> str | None:
        """The compiler version a namespace path names (``.../<runtime_dir>-<version>``)."""
        leaf = path.rstrip("/").rpartition("/")[2]
        head, sep, version = leaf.partition("-")
        return version if sep and head == self.runtime_dir and version[:1].isdigit() else None

    def foreign_names(self, entry: Entry) -> tuple[str, ...]:
        """Names in the entry's directory that are neither the runtime's files of the entry nor
        neffcache's (another tool's: NxD, optimum-neuron). They are not part of the entry:
        never copied with it, never removed with it (docs/runtimes.md, "Files of other tools")."""
        return entry.extra

    def manifest_problems(self, files: Mapping[str, FileInfo], manifest: Manifest,
                          located: Located | None = None) -> list[str]:
        """Cheap checks a listing allows: every recorded file present with its recorded size and,
        given where the entry lies (``located``), every payload file (:meth:`payload_names`)
        recorded: a manifest that leaves out ``model.neff`` vouches for nothing the runtime loads.

        The 0-byte commit marker is required only of manifests of minor revision 1 on: the
        previous release wrote manifests without ``model.done`` (warmers publish it as an empty
        file the manifest did not list), and an upgrade must not turn every store it filled
        CORRUPT (``verify --fix`` would quarantine them all). Its NEFF, the bytes that matter,
        every manifest ever written records; a marker, empty by definition, carries nothing a
        forger could swap. Likewise :attr:`late_payload` only from minor revision 2 on.
        """
        problems = []
        for name, digest in manifest.files.items():
            info = files.get(name)
            if info is None:
                problems.append(f"{name} recorded in the manifest is missing")
            elif info.size != digest.size:
                problems.append(f"{name} is {info.size} bytes, the manifest says {digest.size}")
        if located is not None:
            provisional = self.classify(located, files, None)
            payload = set(self.payload_names(provisional))
            neff = self.names(located.namespace, located.key).neff
            if manifest.minor < 1:
                payload &= {neff} if neff else set()
            elif manifest.minor < 2:
                payload -= self.late_payload
            for name in sorted(payload - manifest.files.keys()):
                problems.append(f"{name} is not covered by the manifest")
        return problems
