"""The entry a new compiler's runtime looks up for a graph an old compiler compiled: its successor.

``neffcache rewarm`` compiles each stored HLO of the old compiler into exactly this entry, and
``neffcache upgrade-report`` looks for exactly this entry, so both ask this module (one home for
the rule, docs/upgrades.md):

- the namespace: the old one with its leaf renamed for the new version (``<target dir>/
  neuronxcc-NEW``); target and LNC from the namespace's target directory, else the entry's
  manifest, else the ``--instance`` the caller names;
- neuronxcc: the same ``MODULE_<graph hash>`` with the ``+<suffix>`` recomputed, from the user
  flags of the old flags file, under the flags form of the *new* namespace
  (:meth:`Layout.key_for`). That form is decided once per namespace by the caller's ``forms``
  (:class:`neffcache.layouts.flags_form.NamespaceForms`: the namespace's own newest entries in
  the stores, else the version table, or a forced form), so rewarm and upgrade-report, asking
  the same stores, name the same successor. An entry whose flags file is missing, unreadable or
  does not hash to its own suffix has no successor (the runtime would look for a name we
  cannot compute);
- torchneuron: neffcache's own key over the same HLO and flags with the new toolchain
  (:func:`neffcache.keys.cache_key`), since that key covers the compiler version. The HLO's
  digest is the key's input, so a caller may take it from the entry's manifest instead of
  reading the HLO (``trust_manifest``); rewarm reads the bytes it will compile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from neffcache.entry import Entry, Namespace
from neffcache.errors import EntryNotFound
from neffcache.instances import lookup_instance
from neffcache.keys import cache_key, key_of_digest
from neffcache.layouts import get_layout
from neffcache.stores.base import Store
from neffcache.toolchain import TARGET_DIRS, Toolchain, target_dir

# The namespace with the flags form decided for it (neffcache.layouts.flags_form.NamespaceForms).
Forms = Callable[[Namespace], Namespace]


@dataclass(frozen=True)
class Successor:
    """Where the new compiler's entry of a graph lies, and the user flags it is compiled with."""

    namespace: Namespace
    key: str
    flags: tuple[str, ...]

    @property
    def path(self) -> str:
        return get_layout(self.namespace.layout).plan_entry(self.namespace, self.key).path


def version_prefixes(layouts: Sequence[str], version: str, *, instance: str | None = None,
                     lnc: int | None = None) -> list[str]:
    """Where a compiler version's namespaces can be in a store: under each target directory (only
    ``instance``'s when given), or at the root."""
    if instance:
        row = lookup_instance(instance)
        tdirs = [target_dir(row.target, lnc or row.default_lnc)]
    else:
        tdirs = list(TARGET_DIRS)
    out = []
    for layout in layouts:
        leaf = get_layout(layout).version_dir(version)
        out.extend([*(f"{t}/{leaf}" for t in tdirs), leaf])
    return out


def renamed_namespace(ns: Namespace, to_version: str, toolchain: Toolchain) -> Namespace:
    """``ns`` for ``to_version``: the same place, its leaf directory renamed (no flags form
    decided yet: the caller's ``forms`` puts it on)."""
    head, _, _ = ns.path.rpartition("/")
    new_leaf = get_layout(ns.layout).version_dir(to_version)
    path = f"{head}/{new_leaf}" if head else new_leaf
    return Namespace(ns.layout, path, to_version, toolchain.target, toolchain.lnc)


def successor_toolchain(entry: Entry, to_version: str, *, instance: str | None = None,
                        lnc: int | None = None) -> Toolchain | None:
    """The new toolchain of ``entry``'s graph: its target and LNC with ``to_version``; None when
    neither its namespace, its manifest nor ``instance`` says the target (a root the runtime
    filled)."""
    ns = entry.namespace
    target, entry_lnc = ns.target, ns.lnc
    if (target is None or entry_lnc is None) and entry.manifest and entry.manifest.toolchain:
        target, entry_lnc = entry.manifest.toolchain.target, entry.manifest.toolchain.lnc
    if (target is None or entry_lnc is None) and instance:
        row = lookup_instance(instance)
        target, entry_lnc = row.target, lnc or row.default_lnc
    if target is None or entry_lnc is None:
        return None
    return Toolchain(to_version, target, entry_lnc)


def successor_key(store: Store, entry: Entry, new_ns: Namespace, toolchain: Toolchain, *,
                  trust_manifest: bool = False) -> tuple[str, list[str]]:
    """(key, user flags) of the entry the runtime of ``new_ns`` looks up for ``entry``'s graph.
    Raises ValueError, saying why, when it cannot be computed."""
    layout = get_layout(entry.layout)
    flags_name = layout.flags_of(entry)
    if flags_name is None:
        if layout.flags_problem(entry.key, None) is not None:
            raise ValueError("no flags file: the flags it was compiled with, and so the name the new "
                             "runtime looks for, are unknown")
        return _content_key(store, entry, (), toolchain, trust_manifest), []
    try:
        data = store.read_bytes(entry.store_path(flags_name))
    except EntryNotFound:
        raise ValueError(f"{flags_name} disappeared") from None
    flags = layout.read_user_flags(flags_name, data)  # ValueError: unreadable
    derived = layout.key_for(entry.key, flags_name, data, new_ns)
    if derived is not None:
        return derived[0], flags
    return _content_key(store, entry, flags, toolchain, trust_manifest), flags


def successor_of(store: Store, entry: Entry, to_version: str, forms: Forms, *, instance: str | None = None,
                 lnc: int | None = None, trust_manifest: bool = False) -> Successor | None:
    """``entry``'s successor under ``to_version``, in the flags form ``forms`` decides for its
    namespace; None when its target is unknown. Raises ValueError when its name cannot be
    computed (see :func:`successor_key`)."""
    toolchain = successor_toolchain(entry, to_version, instance=instance, lnc=lnc)
    if toolchain is None:
        return None
    new_ns = forms(renamed_namespace(entry.namespace, to_version, toolchain))
    key, flags = successor_key(store, entry, new_ns, toolchain, trust_manifest=trust_manifest)
    return Successor(new_ns, key, tuple(flags))


def _content_key(store: Store, entry: Entry, flags: Sequence[str], tc: Toolchain, trust_manifest: bool) -> str:
    # The torchneuron layout's key (neffcache's) covers the compiler version: the new entry has a new key.
    hlo_name = get_layout(entry.layout).hlo_of(entry)
    if hlo_name is None:
        raise ValueError("no stored HLO, cannot be recompiled")
    recorded = entry.manifest.files.get(hlo_name) if trust_manifest and entry.manifest else None
    if recorded is not None:
        return key_of_digest(recorded.sha256, tuple(flags), tc)
    try:
        return cache_key(store.read_bytes(entry.store_path(hlo_name)), tuple(flags), tc)
    except EntryNotFound:
        raise ValueError(f"{hlo_name} disappeared") from None
