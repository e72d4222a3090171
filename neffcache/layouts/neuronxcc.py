"""The neuronxcc layout: libneuronxla's cache (torch-xla, NxD, optimum-neuron, neuron_parallel_compile).

::

    <root>/[<target>-lnc<N>/]neuronxcc-<version>/MODULE_<graph>+<flags>/
        model.hlo_module.pb   (<= 2.13 also model.hlo.pb)
        compile_flags.json    (text form: compile_flags.txt; its md5 is the +<flags> suffix,
                               the forms: see :mod:`neffcache.layouts.flags`)
        model.neff            model.done (written after the neff: the commit marker; the
                              text form writes none, its NEFF commits the entry)
        model.log             failure text        model.hlo_module.pb.lock  while compiling

States in optimum-neuron's cleanup order, first match wins: SUCCESS (neff + marker) > FAILED
(log, no neff) > LOCKED (a ``*.lock``) > EMPTY (an HLO). A lock beside a SUCCESS entry is
stale: the entry stays SUCCESS and the lock is reported (:meth:`NeuronxccLayout.locks_of`).
NxD's ``wrapped_neff.hlo`` beside ``model.neff`` is the entry's (copied, covered by its manifest).
Files the layout does not know are extra: kept, reported, never a reason for CORRUPT.

Which flags file (and so which marker) an entry gets follows its namespace's flags form
(``Namespace.flags_form``, decided by :mod:`neffcache.layouts.flags_form`; else the version
table). Files published with ``compile_flags.txt`` commit by the NEFF, strictly last, with no
``model.done`` (:meth:`NeuronxccLayout.publish_plan`): the rule :meth:`~NeuronxccLayout.classify`
reads entries by, so what neffcache writes reads back as what the text-form runtime writes.

The runtime puts ``neuronxcc-<version>/`` under whatever root it is given; neffcache hands it
``<root>/<target>-lnc<N>`` so NEFFs of different targets never share a directory (the target
is in neither the path nor the flags hash the runtime computes).
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Collection, Mapping, Sequence

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.errors import FlagsFileError
from neffcache.instances import TARGETS
from neffcache.layouts import flags as flagsfile
from neffcache.layouts import neuronxcc_env, neuronxcc_logs
from neffcache.layouts.base import Layout
from neffcache.layouts.flags import FLAGS_JSON, FLAGS_TXT
from neffcache.layouts.keyparts import KeyRule
from neffcache.layouts.neuronxcc_logs import FAILED_WITH, HLO_FILE_RE
from neffcache.layouts.records import (
    TARGET_DIR_RE,
    DirectoryRole,
    EntryNames,
    EntryPlan,
    EnvProblem,
    FailureLog,
    Located,
    LogLine,
    parse_target_dir,
)
from neffcache.manifest import MANIFEST_NAME, Manifest
from neffcache.stores.plain import PlainEntryDirs
from neffcache.toolchain import Toolchain

HLO = "model.hlo_module.pb"
HLO_OLD = "model.hlo.pb"  # <= 2.13
NEFF = "model.neff"
DONE = "model.done"
LOG = "model.log"
LOCK_SUFFIX = ".lock"
# NxD writes the wrapped NEFF's HLO beside model.neff, as the second result of its compile: part
# of the entry (a copy without it is incomplete), not another tool's file.
WRAPPED = "wrapped_neff.hlo"
KNOWN = frozenset({HLO, HLO_OLD, FLAGS_JSON, FLAGS_TXT, NEFF, DONE, LOG, MANIFEST_NAME, WRAPPED})
STALE_LOCK = "stale lock"  # the problem text's prefix for a lock beside a SUCCESS entry

_PATH_RE = re.compile(
    "^" + TARGET_DIR_RE + r"neuronxcc-(?P<ver>[0-9][^/]*)/(?P<key>MODULE_[^/]+)/(?P<name>[^/]+)$"
)
_NS_DIR_RE = re.compile("^" + TARGET_DIR_RE + r"neuronxcc-(?P<ver>[0-9][^/]*)$")
_NS_LEAF = "neuronxcc-"  # how the last name of every directory _NS_DIR_RE matches begins
_new = tuple.__new__
_UNSEEN = Namespace("", "\0", None)  # not yet in a namespaces cache
KEY_PREFIX = "MODULE_"
# What follows KEY_PREFIX in the names the runtime gives entries (MODULE_<graph hash>+<flags
# hash>, neuronxcc_logs._MODULE): the entry directories a walk may count (directory_role).
_KEY_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_+"
# libneuronxla's root lock, at the root or under a target directory neffcache added.
_ROOT_LOCK_RE = re.compile(r"^(?:(?:" + "|".join(TARGETS) + r")-lnc[12]/)?lock$")


class NeuronxccLayout(Layout):
    name = "neuronxcc"
    runtime_dir = "neuronxcc"

    def flags_form(self, namespace: Namespace) -> flagsfile.FlagsForm | None:
        """The flags form entries of ``namespace`` are named by: the one decided for it, else the
        version table's; None when neither is known (an unreadable version)."""
        if namespace.flags_form is not None:
            form = flagsfile.FORMS.get(namespace.flags_form)
            if form is None:
                raise FlagsFileError(f"unknown flags form {namespace.flags_form!r}")
            return form
        answer = flagsfile.form_by_version(namespace.compiler_version or "")
        return answer.form if answer is not None else None

    def names(self, namespace: Namespace, key: str) -> EntryNames:
        # The flags file's name is the one of the namespace's form; the text form has no done.
        form = self.flags_form(namespace)
        flags = form.file_name if form is not None else FLAGS_JSON
        marker = NEFF if form is not None and form.neff_commits else DONE
        return EntryNames(hlo=HLO, flags=flags, neff=NEFF, marker=marker, manifest=MANIFEST_NAME,
                          failure_log=LOG, runtime_lock=HLO + LOCK_SUFFIX)

    def hlo_of(self, entry: Entry) -> str | None:
        return next((n for n in (HLO, HLO_OLD) if n in entry.files), None)

    def flags_of(self, entry: Entry) -> str | None:
        return next((n for n in (FLAGS_JSON, FLAGS_TXT) if n in entry.files), None)

    def locks_of(self, entry: Entry) -> tuple[str, ...]:
        return tuple(sorted(n for n in entry.files if n.endswith(LOCK_SUFFIX)))

    # Manifests written before neffcache knew NxD's wrapped NEFF (minor < 2) did not cover it.
    late_payload = frozenset({WRAPPED})

    def payload_names(self, entry: Entry) -> frozenset[str]:
        return frozenset({NEFF, entry.marker_name, *(n for n in (WRAPPED,) if n in entry.files)})

    def state_anchor(self, entry: Entry) -> str | None:
        # A NEFF without model.done is uncommitted; a legacy entry's NEFF is its marker; else
        # the failure log makes it FAILED, else the HLO makes it EMPTY.
        return next((n for n in (NEFF, LOG, HLO, HLO_OLD) if n in entry.files), None)

    # -- the failure log ---------------------------------------------------------------------
    def read_failure_log(self, data: bytes) -> FailureLog:
        """libneuronxla's ``Failed compilation with [<command>]: <stderr>`` (:mod:`.neuronxcc_logs`)."""
        return neuronxcc_logs.read_failure_log(data)

    def failure_log_bytes(self, command: Sequence[str], output: str) -> bytes:
        """The runtime's own form, so a runtime and neffcache read each other's logs alike."""
        return f"{FAILED_WITH}{list(command)!r}: {output}".encode()

    # -- the flags file and the MODULE name (see neffcache.layouts.flags) ---------------------
    def flags_file(self, namespace: Namespace, key: str, flags: Sequence[str]) -> tuple[str, bytes]:
        """(name, bytes) of the flags file the runtime of ``namespace`` (in its flags form)
        writes for ``flags``: what neffcache writes too, so the name it uses is the one that
        runtime computes."""
        form = self.flags_form(namespace)
        if form is None:
            raise FlagsFileError(f"compiler version {namespace.compiler_version!r} unknown: no flags-file form")
        return flagsfile.flags_file(form, namespace.target, flags)

    def read_user_flags(self, name: str, data: bytes) -> list[str]:
        """The user flags a flags file holds (target form: without its leading ``--target=``)."""
        return flagsfile.read_flags_file(name, data)[0]

    def stated_flags(self, name: str, data: bytes) -> list[str]:
        user, target = flagsfile.read_flags_file(name, data)
        return [*user, f"--target={target}"] if target else user

    def flags_problem(self, key: str, data: bytes | None) -> str | None:
        """Why an entry's flags file (``None``: absent) does not back its MODULE name, or None."""
        if data is None:
            return "no flags file: the MODULE name's +<flags> suffix cannot be checked"
        return flagsfile.suffix_problem(key, data)

    def key_for(self, key: str, name: str, data: bytes, namespace: Namespace) -> tuple[str, str, bytes] | None:
        """(key, flags-file name, flags-file bytes) of entry ``key`` (whose flags file ``name``
        holds ``data``) for the runtime of ``namespace``: the same graph hash, the suffix
        recomputed under that namespace's flags form. Raises :class:`FlagsFileError` when it cannot."""
        parts = flagsfile.split_module(key)
        if parts is None:
            raise FlagsFileError(f"{key} is not a MODULE_<graph>+<flags> name")
        problem = flagsfile.suffix_problem(key, data)
        if problem is not None:
            raise FlagsFileError(problem)
        user, target = flagsfile.read_flags_file(name, data)
        if target is not None and namespace.target is not None and target != namespace.target:
            raise FlagsFileError(f"the flags file says --target={target}, the namespace is {namespace.target}")
        new_name, new_data = self.flags_file(namespace, key, user)
        return flagsfile.module_name(parts[0], flagsfile.suffix_of(new_data)), new_name, new_data

    # -- what a key is made of (why-miss; neffcache.layouts.keyparts) ---------------------------
    def claims_key(self, key: str) -> bool:
        return flagsfile.split_module(key) is not None

    def graph_of(self, key: str) -> str | None:
        parts = flagsfile.split_module(key)
        return parts[0] if parts else None

    def job_settings(self, flags: Sequence[str]) -> dict[str, str]:
        return neuronxcc_env.job_settings(flags)

    def key_flags(self, flags: Sequence[str]) -> list[str]:
        return flagsfile.user_flags(flags)

    def key_with_flags(self, key: str, namespace: Namespace, flags: Sequence[str]) -> str | None:
        parts = flagsfile.split_module(key)
        if parts is None:
            return None
        _, data = self.flags_file(namespace, key, flags)
        return flagsfile.module_name(parts[0], flagsfile.suffix_of(data))

    def flags_forms(self) -> tuple[str, ...]:
        return tuple(flagsfile.FORMS)

    def key_rule(self, namespace: Namespace) -> KeyRule | None:
        form = self.flags_form(namespace)
        return flagsfile.key_rule(form) if form is not None else None

    def key_rule_of_file(self, key: str, name: str, data: bytes) -> KeyRule | None:
        form = flagsfile.adopted_form(key, name, data)
        return flagsfile.key_rule(form) if form is not None else None

    def flags_target(self, name: str, data: bytes) -> str | None:
        try:
            return flagsfile.read_flags_file(name, data)[1]
        except FlagsFileError:
            return None

    def flags_beside(self, file_name: str) -> tuple[str, ...]:
        # The entry's own file or the work directory's model.MODULE_<g>+<f>.hlo_module.pb.
        return (FLAGS_JSON, FLAGS_TXT) if HLO_FILE_RE.search(file_name) else ()

    def entry_named(self, path: str) -> str | None:
        return neuronxcc_logs.entry_named(path)

    # -- log lines ------------------------------------------------------------------------
    def parse_log_line(self, line: str) -> LogLine | None:
        return neuronxcc_logs.parse_log_line(line)

    def parse_log_lines(self, line: str) -> list[LogLine]:
        """:meth:`parse_log_line` with the compiler call counted as both a miss and a compile."""
        found = self.parse_log_line(line)
        if found is None:
            return []
        if found.kind == "compile":
            return [LogLine("miss", found.entry, found.path), found]
        return [found]

    def is_runtime_file(self, path: str) -> bool:
        return _ROOT_LOCK_RE.match(path) is not None

    def namespace_for(self, toolchain: Toolchain) -> Namespace:
        path = f"{toolchain.target_dir}/neuronxcc-{toolchain.compiler_version}"
        return Namespace(self.name, path, toolchain.compiler_version, toolchain.target, toolchain.lnc)

    def namespace_dir(self, directory: str) -> Namespace | None:
        """The namespace whose directory is ``directory``, or None."""
        match = _NS_DIR_RE.match(directory)
        if not match:
            return None
        target, lnc = parse_target_dir(match)
        return Namespace(self.name, directory, match.group("ver"), target, lnc)

    def directory_role(self, directory: str, namespaces: dict[str, Namespace | None] | None = None
                       ) -> DirectoryRole | None:
        """:meth:`Layout.directory_role`, from the last name first: ``MODULE_`` and more can only be
        an entry's directory (a namespace's last name is ``neuronxcc-...``) of its parent's
        namespace, looked up in ``namespaces`` (one regex per namespace, not per entry);
        ``neuronxcc-...`` only a namespace directory, whose children named ``MODULE_`` and more
        are its entries: the rule takes the runtime's own characters only (``_KEY_CHARS``), so
        that no other layout's answer for such a name can differ from one child to another.
        :meth:`classify` makes an entry whose names are all ``KNOWN`` (no lock, nothing foreign),
        with ``model.done`` (then it is the marker: only an entry without one is of the legacy
        era) and a non-empty ``model.neff``, a committed SUCCESS entry; without a manifest nothing
        else is asked (tests/layouts/test_plain_entry_dirs.py holds the rule to ``classify``).
        Any other name is nothing here. An entry is ``flat``: nested files are never its own."""
        parent, _, leaf = directory.rpartition("/")
        if leaf.startswith(KEY_PREFIX):
            ns = self._cached_namespace(parent, namespaces) if len(leaf) > len(KEY_PREFIX) else None
            # tuple.__new__ skips the NamedTuples' Python-level __new__: once per entry directory.
            return None if ns is None else _new(DirectoryRole, (
                _new(Located, (ns, leaf, directory, directory, "")), True, None, None, None, None))
        ns = self._cached_namespace(directory, namespaces) if leaf.startswith(_NS_LEAF) else None
        return None if ns is None else DirectoryRole(
            entries_below=PlainEntryDirs(KEY_PREFIX, _KEY_CHARS, tuple(sorted(KNOWN)), (DONE, NEFF), NEFF, ns))

    def _cached_namespace(self, directory: str, namespaces: dict[str, Namespace | None] | None) -> Namespace | None:
        """:meth:`namespace_dir`, kept in ``namespaces`` (by directory) when given."""
        ns = namespaces.get(directory, _UNSEEN) if namespaces is not None else _UNSEEN
        if ns is _UNSEEN:  # one lookup when it is known: asked once per entry directory
            ns = self.namespace_dir(directory)
            if namespaces is not None:
                namespaces[directory] = ns
        return ns

    def locate(self, path: str) -> Located | None:
        match = _PATH_RE.match(path)
        if not match:
            return None
        target, lnc = parse_target_dir(match)
        ver = match.group("ver")
        ns_path = posixpath.dirname(posixpath.dirname(path))
        ns = Namespace(self.name, ns_path, ver, target, lnc)
        base = posixpath.join(ns_path, match.group("key"))
        return Located(ns, match.group("key"), base, base, match.group("name"))

    def plan_entry(self, namespace: Namespace, key: str) -> EntryPlan:
        base = posixpath.join(namespace.path, key) if namespace.path else key
        return EntryPlan(namespace, key, base, base, MANIFEST_NAME, self.names(namespace, key).marker)

    def publish_plan(self, namespace: Namespace, key: str, names: Collection[str], *, local: bool = False
                     ) -> EntryPlan:
        """:meth:`plan_entry`, its marker chosen by the files being published when they hold a
        flags file: ``compile_flags.txt`` alone (no ``model.done`` among them) is the text form,
        committed by its NEFF (the rule :meth:`classify` reads such an entry by); any other
        flags file commits with ``model.done``. A copy of an entry then keeps its own form (a
        node-local tier, ``local``, keeps the same one: libneuronxla has no form of its own there)."""
        plan = self.plan_entry(namespace, key)
        if FLAGS_TXT not in names and FLAGS_JSON not in names:
            return plan
        marker = NEFF if _neff_commits(names) else DONE
        return plan if marker == plan.marker_name else dataclasses.replace(plan, marker_name=marker)

    def write_order(self, names: list[str], marker: str, manifest: str) -> list[str]:
        # The manifest first: from then on the directory reads as "uncommitted" (never as an
        # EMPTY entry a runtime would pick up) until the marker, strictly last, commits it.
        rank = {manifest: 0, HLO: 1, FLAGS_JSON: 2, FLAGS_TXT: 2, NEFF: 3, LOG: 3, marker: 9}
        return sorted(names, key=lambda n: (rank.get(n, 2), n))

    def data_before_manifest(self, names: list[str]) -> list[str] | None:
        # A NEFF without model.done reads as uncommitted (classify); an HLO alone would read as
        # EMPTY, a graph a runtime would pick up and compile. So the NEFF first, or nothing.
        if NEFF not in names:
            return None
        return [NEFF, *(n for n in self.write_order(names, DONE, MANIFEST_NAME) if n != NEFF)]

    def compile_only_env(self, environ: Mapping[str, str], *, retry_failed: bool,
                         toolchain: Toolchain | None = None, workers: int | None = None
                         ) -> tuple[dict[str, str | None], list[str]]:
        return neuronxcc_env.compile_only(environ, retry_failed=retry_failed)

    def env_problems(self, environ: Mapping[str, str]) -> list[EnvProblem]:
        return neuronxcc_env.problems(environ)

    def job_env(self, root: str, namespace: Namespace) -> dict[str, str]:
        # The runtime appends neuronxcc-<version> itself: hand it the directory above.
        parent = posixpath.dirname(namespace.path)
        url = posixpath.join(root, parent) if parent else root
        return {"NEURON_COMPILE_CACHE_URL": url}

    def classify(
        self, located: Located, files: Mapping[str, FileInfo], manifest: Manifest | None,
        manifest_error: str | None = None,
    ) -> Entry:
        names = files.keys()
        problems: list[str] = []
        committed = True
        if names <= KNOWN:  # the common case, and a set test instead of two loops per entry
            extra: tuple[str, ...] = ()
            locks: list[str] = []
        else:
            extra = tuple(sorted(n for n in names if n not in KNOWN and not n.endswith(LOCK_SUFFIX)))
            locks = [n for n in names if n.endswith(LOCK_SUFFIX)]
        marker = NEFF if _neff_commits(names) else DONE
        neff = files.get(NEFF)

        if manifest_error:
            problems.append(manifest_error)
        if manifest is not None:
            problems.extend(self.manifest_problems(files, manifest, located))

        # optimum-neuron's cleanup order, first match wins: SUCCESS > FAILED > LOCKED > EMPTY.
        if problems and marker in names:
            state = EntryState.CORRUPT
        elif neff is not None and marker in names:
            state = EntryState.SUCCESS
            if neff.size == 0:
                state, problems = EntryState.CORRUPT, [*problems, "model.neff is empty"]
            problems.extend(f"{STALE_LOCK} {n}: the entry is complete, no compile holds it" for n in sorted(locks))
        elif LOG in names and neff is None and MANIFEST_NAME not in names:
            state = EntryState.FAILED
        elif locks:
            state = EntryState.LOCKED
        elif neff is not None or MANIFEST_NAME in names:
            state, committed = EntryState.CORRUPT, False
            problems.append(f"uncommitted: no {marker} (an interrupted or ongoing write)")
        elif DONE in names:
            state = EntryState.CORRUPT
            problems.append("model.done without model.neff")
        elif HLO in names or HLO_OLD in names:
            state = EntryState.EMPTY
        else:
            state = EntryState.CORRUPT
            problems.append("no HLO, NEFF or log")
        if state is EntryState.SUCCESS and HLO not in names and HLO_OLD not in names:
            problems.append("no model.hlo_module.pb: the entry serves but cannot be recompiled")
        return self.entry_at(located, files, state, problems, manifest, manifest_name=MANIFEST_NAME,
                             marker_name=marker, committed=committed, extra=extra)

    # -- what scan, load_entry and prune ask (issue #11) ---------------------------------------
    entry_is_dir = True

    def locate_entry(self, path: str) -> Located | None:
        return self.locate(f"{path}/{NEFF}")


def _neff_commits(names: Collection[str]) -> bool:
    """The text form's entries (``compile_flags.txt``, no JSON flags file, no ``model.done``)
    are committed by their NEFF: one rule for reading entries and for writing them."""
    return FLAGS_TXT in names and FLAGS_JSON not in names and DONE not in names
