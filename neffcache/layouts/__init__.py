"""Layouts: how runtimes arrange entries under a cache root. One registry, by name."""

from __future__ import annotations

from neffcache.errors import ConfigError
from neffcache.layouts.base import Layout
from neffcache.layouts.neuronxcc import NeuronxccLayout
from neffcache.layouts.nxdi import NxdiLayout
from neffcache.layouts.records import EntryNames, EntryPlan, Located, LogLine
from neffcache.layouts.torchneuron import TorchNeuronLayout
from neffcache.layouts.vllm import VllmLayout
from neffcache.toolchain import LAYOUT_NAMES

LAYOUTS: dict[str, Layout] = {
    layout.name: layout for layout in (NeuronxccLayout(), TorchNeuronLayout(), VllmLayout(), NxdiLayout())
}
# One list of names: the index server (which has no layouts) validates against LAYOUT_NAMES.
if tuple(LAYOUTS) != LAYOUT_NAMES:
    raise ImportError(f"the layout registry {tuple(LAYOUTS)} differs from neffcache.toolchain.LAYOUT_NAMES "
                      f"{LAYOUT_NAMES}: change both")


def get_layout(name: str) -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ConfigError(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}") from None


def entry_forms(path: str) -> tuple[str, ...]:
    """Every path at which the entry whose path is ``path`` may lie (:meth:`Layout.entry_paths`),
    ``path`` first: a copy that finds it at any of them finds it present. ``(path,)`` when no
    layout places it, or its layout has one form."""
    for layout in LAYOUTS.values():
        if not layout.has_other_forms:
            continue
        found = layout.locate_entry(path)
        if found is not None:
            return (path, *(p for p in layout.entry_paths(found.namespace, found.key) if p != path))
    return (path,)


def locate(path: str) -> Located | None:
    """The entry a store-relative file belongs to, in whichever layout claims it."""
    for layout in LAYOUTS.values():
        found = layout.locate(path)
        if found is not None:
            return found
    return None


def prune_group_dir(entry_path: str) -> str:
    """The directory an entry's prune group is named by: a layout's rule, else its parent."""
    for layout in LAYOUTS.values():
        found = layout.prune_group_dir(entry_path)
        if found is not None:
            return found
    return entry_path.rpartition("/")[0]


__all__ = ["LAYOUTS", "EntryNames", "EntryPlan", "Layout", "Located", "LogLine", "entry_forms", "get_layout",
           "locate", "prune_group_dir"]
