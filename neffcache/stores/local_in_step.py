"""Listing sibling trees in step: layout B's ``hlo/`` and ``neff/``, the same shard path in
each (the trees a local store's :meth:`Store.walk` held back). A summary then knows an entry
whole once its shard is listed (neffcache/scan/summary.py), and, given a rule of the
plan's (:class:`~neffcache.stores.plain.PlainFiles`), the C helper counts the shard
directories that need nothing but counting instead of listing them.

The walk is :mod:`neffcache.stores.local_listing`'s: each directory opened relative to its
parent, no symlink followed, what cannot be opened reported as a problem of its parent's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from neffcache.errors import UnsafePath
from neffcache.stores import local_listing
from neffcache.stores.local_listing import dir_problem, list_fd, unreadable
from neffcache.stores.safepath import DIR_FLAGS, SafeRoot
from neffcache.stores.walk import Counted, DirListing, InStep, WalkPlan


def walk_together(safe: SafeRoot, trees: Sequence[str], plan: WalkPlan | None = None, group: str = ""
                  ) -> Iterator[InStep | Counted]:
    """The directories ``trees`` (of ``group``) walked in step: depth first over the union of
    their relative subdirectories (sorted), each relative directory listed in every tree that
    has it before the walk goes below it (an :class:`InStep` batch). Problems are the walk's
    own: what cannot be opened is a problem of its parent's, worded by :func:`dir_problem`.

    With ``plan`` and the C helper, the children a level's rule (``plan.shards_below``) covers
    are counted in C (:func:`count_children`, a :class:`Counted` item) and only those it
    declines are walked."""
    frames: list[tuple[int, str]] = []
    problems: list[DirListing] = []
    try:
        for tree in trees:
            parent, _, name = tree.rpartition("/")
            try:
                pfd = safe.open_dir(parent)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except (UnsafePath, OSError) as exc:  # swapped for a link, or unreadable, since the walk
                head, _, leaf = parent.rpartition("/")
                why = exc.reason if isinstance(exc, UnsafePath) else f"unreadable directory ({exc.strerror or exc})"
                problems.append(DirListing(head, [], [], ((leaf, why),)))
                continue
            try:
                fd = _open_child(safe, pfd, parent, name, problems)
            finally:
                os.close(pfd)
            if fd is not None:
                frames.append((fd, tree))
    except BaseException:
        for fd, _ in frames:
            os.close(fd)
        raise
    counter = plan if local_listing.native is not None else None
    for rel, batch, counted in _in_step(safe, frames, "", problems, counter):
        if counted is not None:
            yield counted
        if batch:
            yield InStep(group, rel, batch)


def _open_child(safe: SafeRoot, pfd: int, path: str, name: str, problems: list[DirListing]) -> int | None:
    """The subdirectory ``name`` of ``pfd`` (whose store path is ``path``) opened as the walk
    opens it, or None: gone meanwhile, or what could not be opened added to ``problems`` as a
    problem of its parent's, worded by :func:`dir_problem`."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=pfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        reason = dir_problem(safe, pfd, name, exc)
        if reason is not None:
            problems.append(DirListing(path, [], [], ((name, reason),)))
        return None


def count_children(plan: WalkPlan, listed: list[tuple[int, str]],
                   subdirs: dict[str, list[tuple[int, str]]]) -> Counted | None:
    """Count the children of a level (open as ``listed``: (fd, store path) in each tree) that
    its :class:`PlainFiles` rule covers, and take the counted ones out of ``subdirs`` (name ->
    the parents that have it): only what the C helper declines is walked. The C helper is there.
    The count's ``top`` names its entries' directories by the store paths of ``listed``."""
    if len(listed) > 30:  # the helper's mask has a bit per tree
        return None
    rule = plan.shards_below([path for _, path in listed])
    if rule is None:
        return None
    position = {fd: i for i, (fd, _) in enumerate(listed)}
    children = [(name, sum(1 << position[fd] for fd, _ in parents))
                for name, parents in subdirs.items() if name in rule.children]
    if not children:
        return None
    native = local_listing.native
    assert native is not None  # walk_together passes ``plan`` only then
    fds = tuple(fd for fd, _ in listed)
    primary = tuple(path in rule.primary_dirs for _, path in listed)
    entries, size, files, declined, top = native.count_plain(
        fds, primary, children, rule.prefix, rule.suffixes, rule.primary, rule.key_min, rule.key_max,
        plan.largest, tuple(path for _, path in listed))
    kept = set(declined)
    for name, _ in children:
        if name not in kept:
            del subdirs[name]
    return Counted(rule, entries, size, files, top) if entries else None


def _list_level(safe: SafeRoot, current: list[tuple[int, str]], batch: list[DirListing],
                plan: WalkPlan | None) -> tuple[dict[str, list[tuple[int, str]]], Counted | None]:
    """List one relative directory open in each tree as ``current`` into ``batch``; returns its
    subdirectories still to walk (name -> [(parent fd, parent path) in each tree that has it]):
    all of them, less those ``plan``'s rule lets the C helper count (:func:`count_children`),
    and that count."""
    subdirs: dict[str, list[tuple[int, str]]] = {}
    listed: list[tuple[int, str]] = []
    for fd, path in current:
        try:
            names, listing = list_fd(safe, fd, path)
        except OSError as exc:
            batch.append(unreadable(path, exc))
            continue
        if listing is not None:
            batch.append(listing)
        listed.append((fd, path))
        for name in names:
            subdirs.setdefault(name, []).append((fd, path))
    counted = count_children(plan, listed, subdirs) if plan is not None and subdirs else None
    return subdirs, counted


def _in_step(safe: SafeRoot, frames: list[tuple[int, str]], rel: str, batch: list[DirListing],
             plan: WalkPlan | None = None) -> Iterator[tuple[str, list[DirListing], Counted | None]]:
    """List the relative directory ``rel`` open in each tree as ``frames`` (consumed: closed
    however the walk ends), then what lies below it, in step, depth first. ``batch``: what
    could not be opened of ``rel``, reported with it. A loop over a stack, not recursion: a
    million entries are a hundred thousand shard directories, each a step."""
    # Per level: the descriptors to close when done, the level's path, and its subdirectories
    # still to visit: (name, [(parent fd, parent path) in each tree that has it]).
    stack: list[tuple[list[tuple[int, str]], str, Iterator[tuple[str, list[tuple[int, str]]]]]] = []
    current: list[tuple[int, str]] | None = frames
    try:
        while current is not None:
            subdirs, counted = _list_level(safe, current, batch, plan)
            if subdirs:
                stack.append((current, rel, iter(sorted(subdirs.items()))))
            else:
                for fd, _ in current:
                    os.close(fd)
            current = None
            if batch or counted is not None:
                yield rel, batch, counted
            while stack:
                _, parent_rel, pending = stack[-1]
                step = next(pending, None)
                if step is None:
                    for fd, _ in stack.pop()[0]:
                        os.close(fd)
                    continue
                name, parents = step
                rel = f"{parent_rel}/{name}" if parent_rel else name
                current, batch = [], []
                for pfd, path in parents:
                    child = _open_child(safe, pfd, path, name, batch)
                    if child is not None:
                        current.append((child, f"{path}/{name}"))
                break
    finally:
        for fd, _ in current or ():
            os.close(fd)
        for level, _, _ in stack:
            for fd, _ in level:
                os.close(fd)
