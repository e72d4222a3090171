"""Listing a local cache root: every directory below it, its files and what could not be read.

A scan lists hundreds of thousands of files, so this is the hot path of a local store. Two
ways, chosen by :class:`~neffcache.stores.local.LocalStore` from its ``list_workers``:

- :func:`walk`, depth first on one thread, each subdirectory opened relative to its parent's
  descriptor. A local disk answers a stat from the dentry cache in a microsecond or two, and
  threads would only add GIL handoffs;
- :func:`list_threaded`, breadth first on many threads, for shared mounts (Lustre, NFS) where
  every stat is a round trip to a metadata server.

:func:`walk` takes a scan's plan (neffcache/stores/walk.py): it holds back the subtrees the
plan names, which :mod:`~neffcache.stores.local_in_step` then lists in step (layout B's ``hlo/``
and ``neff/``, the same shard path in each: a summary then knows an entry whole once its shard
is listed, neffcache/scan/summary.py), and counts the entry directories the plan's rules
cover instead of listing them.

Both follow no symlink (:mod:`neffcache.stores.safepath`): a link to a file inside the root is
listed with its target's size, anything else that cannot be listed is reported in
``DirListing.problems`` instead of raising, so one bad directory does not hide the rest.

Both stop at :data:`MAX_DEPTH` levels below the root: a deeper directory is reported against
its parent ("nested more than … deep"), never opened. No runtime nests entries more than a few
levels, and without the bound a co-tenant's 20,000-deep chain cost a descriptor per level (the
walk ran out of them) and memory quadratic in the depth (each level's path is as long as the
depth); with it, a walk holds at most MAX_DEPTH descriptors and paths.

The per-file loop (readdir, an ``lstat`` per regular file, the ``FileInfo``) runs in C when the
helper ``neffcache.stores._listdir`` was built (``pip install`` builds it with the system's C
compiler; it is optional): the same syscalls with the same flags, a third of the time of
``os.scandir`` + ``DirEntry.stat``. It never resolves a symlink: it hands the names of links
back, and :func:`add_links` applies :meth:`SafeRoot.resolve_listed_link` to them exactly as the
Python loop does. Without the helper, or with ``NEFFCACHE_NATIVE=0``, the Python loop below
lists; tests/stores/test_listing_paths.py runs the listing and containment cases on both.
"""

from __future__ import annotations

import errno
import importlib
import os
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from neffcache.entry import FileInfo
from neffcache.errors import UnsafePath
from neffcache.regular import kind
from neffcache.stores.safepath import DIR_FLAGS, SafeRoot
from neffcache.stores.walk import Counted, DirListing, WalkItem, WalkPlan

if TYPE_CHECKING:
    from neffcache.stores._listdir import Walker


@dataclass(frozen=True)
class NativeListing:
    """Whether the local listing runs in C, and if not, why: the helper is optional (a host
    without a compiler installs without it), so ``neffcache --version`` and ``doctor`` say which
    path a scan takes rather than leave a listing three times as slow to be found by timing it."""

    active: bool
    why_off: str = ""  # "" when active; else ``NEFFCACHE_NATIVE=0`` or the import's error
    chosen: bool = False  # turned off on purpose (NEFFCACHE_NATIVE=0), not missing

    def describe(self) -> str:
        return "active" if self.active else f"off ({self.why_off})"


def _load_native() -> tuple[ModuleType | None, NativeListing]:
    """The C helper (None when it was not built or ``NEFFCACHE_NATIVE=0`` turns it off), and why."""
    setting = os.environ.get("NEFFCACHE_NATIVE", "1").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return None, NativeListing(False, f"NEFFCACHE_NATIVE={setting}", chosen=True)
    try:
        # By its full name: ``from neffcache.stores import`` would read as importing the package
        # (tests/test_layers.py), which imports this module.
        module = importlib.import_module("neffcache.stores._listdir")
    except ImportError as exc:
        # The error names what is missing (no module: never built; an undefined symbol or a
        # wrong ABI tag: built for another Python), which is the whole diagnosis.
        return None, NativeListing(False, f"the C helper was not built: {exc}")
    if not hasattr(module.Walker, "count_children"):
        # An editable install not rebuilt since the walker's interface changed: its steps have
        # another shape, so it is not used at all (reinstalling builds the current one).
        return None, NativeListing(False, "the C helper is an older build (reinstall neffcache to rebuild it)")
    return module, NativeListing(True)


# Read at call time: tests set it to None to run the Python loop.
native, _loaded = _load_native()


def native_listing() -> NativeListing:
    """Which listing a scan in this process takes (``native`` as it is now, not as loaded)."""
    if native is None and _loaded.active:
        return NativeListing(False, "turned off in this process", chosen=True)
    return _loaded if native is None else NativeListing(True)


# Directory levels below the root a listing enters (the module docstring); _listdir.c has its own
# copy, checked equal by tests/stores/test_listing_paths.py.
MAX_DEPTH = 128
TOO_DEEP = f"nested more than {MAX_DEPTH} directories deep (not listed)"


def too_deep(rel: str) -> bool:
    """Whether the directory ``rel`` (a store path) lies deeper than :data:`MAX_DEPTH`."""
    return rel.count("/") >= MAX_DEPTH


def special_problem(mode: int) -> str:
    """Why a listing does not list a special file of ``mode`` (a FIFO, a socket, a device)."""
    return f"{kind(mode)}, not a regular file (not listed)"


def dir_problem(safe: SafeRoot, fd: int, name: str, exc: OSError) -> str | None:
    """Why a subdirectory could not be opened, or None when it just went away meanwhile."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a symlinked directory (not followed)" if safe.is_link(fd, name) else None
    return f"unreadable directory ({exc.strerror or exc})"


def unreadable(path: str, exc: OSError) -> DirListing:
    """The directory ``path``, opened but not listable, as a problem of its parent's."""
    head, _, name = path.rpartition("/")
    return DirListing(head, [], [], ((name, f"unreadable directory ({exc.strerror})"),))


def add_links(safe: SafeRoot, fd: int, rel: str, links: list[str], names: list[str], files: list[FileInfo],
              problems: list[tuple[str, str]]) -> None:
    """The symlinks the C helper listed in ``rel`` (open as ``fd``): each one an in-root file
    link resolves to is listed with its target's size, any other one is a problem."""
    prefix = rel + "/" if rel else ""
    for name in links:
        try:
            st = safe.resolve_listed_link(fd, rel, name)
        except UnsafePath as exc:
            problems.append((name, exc.reason))
            continue
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed while we listed
        names.append(name)
        files.append(FileInfo(prefix + name, st.st_size, st.st_mtime))


def list_fd(safe: SafeRoot, fd: int, rel: str) -> tuple[list[str], DirListing | None]:
    """List one open directory: (its subdirectory names, its files and problems)."""
    if native is not None:
        subdirs, names, files, links, special = native.list_dir(fd, rel + "/" if rel else "", FileInfo)
        problems: list[tuple[str, str]] = list(special)
        if links:
            add_links(safe, fd, rel, links, names, files, problems)
        if files or problems:
            return subdirs, DirListing(rel, names, files, tuple(problems))
        return subdirs, None
    return _list_fd_python(safe, fd, rel)


def _list_fd_python(safe: SafeRoot, fd: int, rel: str) -> tuple[list[str], DirListing | None]:
    prefix = rel + "/" if rel else ""
    subdirs: list[str] = []
    names: list[str] = []
    files: list[FileInfo] = []
    problems: list[tuple[str, str]] = []
    add_dir, add_name, add_file, new = subdirs.append, names.append, files.append, tuple.__new__
    with os.scandir(fd) as it:
        for item in it:
            # d_type answers is_dir/is_file without a syscall: stat regular files only.
            try:
                if item.is_dir(follow_symlinks=False):
                    add_dir(item.name)
                    continue
                if item.is_file(follow_symlinks=False):
                    st = item.stat(follow_symlinks=False)
                    if st.st_mode & 0o170000 != 0o100000:  # no longer a regular file
                        continue
                elif item.is_symlink():
                    try:
                        st = safe.resolve_listed_link(fd, rel, item.name)
                    except UnsafePath as exc:
                        problems.append((item.name, exc.reason))
                        continue
                else:
                    # A FIFO, a socket, a device: nothing a cache holds, and a reader that opens
                    # one may wait for ever. Reported, never opened (_listdir.c: the same words).
                    problems.append((item.name, special_problem(item.stat(follow_symlinks=False).st_mode)))
                    continue
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed while we listed: a concurrent prune or publish
            name = item.name
            add_name(name)
            # tuple.__new__ skips the NamedTuple's Python-level __new__: this runs once per
            # file, hundreds of thousands of times a scan.
            add_file(new(FileInfo, (prefix + name, st.st_size, st.st_mtime)))
    if files or problems:
        return subdirs, DirListing(rel, names, files, tuple(problems))
    return subdirs, None


def list_rels(safe: SafeRoot, directories: list[str]) -> tuple[list[str], list[DirListing]]:
    """List a batch of directories by path, each opened by a walk from the root (threads)."""
    subdirs: list[str] = []
    listings: list[DirListing] = []
    for rel in directories:
        try:
            fd = safe.open_dir(rel)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except UnsafePath as exc:
            head, _, name = rel.rpartition("/")
            listings.append(DirListing(head, [], [], ((name, exc.reason),)))
            continue
        except OSError as exc:
            listings.append(unreadable(rel, exc))
            continue
        try:
            names, listing = list_fd(safe, fd, rel)
        except OSError as exc:
            listings.append(unreadable(rel, exc))
            continue
        finally:
            os.close(fd)
        prefix = rel + "/" if rel else ""
        if names and too_deep(prefix + names[0]):  # every child of rel is as deep as the first
            listings.append(DirListing(rel, [], [], tuple((n, TOO_DEEP) for n in names)))
            names = []
        subdirs.extend(prefix + n for n in names)
        if listing is not None:
            listings.append(listing)
    return subdirs, listings


def walk(safe: SafeRoot, fd: int, start: str, plan: WalkPlan | None = None,
         held: dict[str, list[str]] | None = None) -> Iterator[WalkItem]:
    """Depth first from the open directory ``fd`` (consumed), each subdirectory opened relative
    to its parent: no path is resolved twice, and at most one descriptor per level is held.

    With ``plan`` (stores/walk.py), a subdirectory named in ``plan.held`` that
    ``plan.in_step_group`` places in a group is left alone (not even opened) and added to
    ``held`` by group, for the caller to list in step; and with the C helper, the entry
    directories ``plan.entries_below`` covers are counted in C, not walked (a ``Counted`` item,
    yielded before the directory's own listing; the Python walk lists them all). ``fd`` is
    closed also when the walk cannot start. Without ``held`` nothing is held back: a tree the
    walk left out would be lost to a caller that has nowhere to put it."""
    holding = plan.held if plan is not None and held is not None else frozenset()
    if native is None:
        return _walk_python(safe, fd, start, plan, holding, held)
    names = frozenset(os.fsencode(n) for n in holding) or None
    walker = native.Walker(fd, start, FileInfo, names, plan is not None)
    return _walk_native(safe, walker, plan, held)


def _walk_native(safe: SafeRoot, walker: Walker, plan: WalkPlan | None, held: dict[str, list[str]] | None
                 ) -> Iterator[WalkItem]:
    """:func:`walk` by the C helper: the same order, the same problems (its docstring). The
    walker is steered between two steps (it calls nothing back): what it held back is released
    or kept for later, what the plan's rule covers is counted."""
    new = tuple.__new__
    try:
        for rel, names, files, links, problems, dfd, pending, kept in walker:
            for name in kept:  # only with a plan and somewhere to put what it holds (walk)
                if not _held_back(plan, held, f"{rel}/{name}" if rel else name):
                    walker.release(name)
            if pending and plan is not None:
                rule = plan.entries_below(rel)
                if rule is not None:
                    entries, size, count, top = walker.count_children(
                        rule.prefix, rule.charset, rule.names, rule.required, rule.primary, plan.largest)
                    if entries:
                        yield Counted(rule, entries, size, count, top)
            if not links:
                if files or problems:
                    yield new(DirListing, (rel, names, files, problems))
                continue
            found = list(problems)  # the listed directory is still open as dfd until the next step
            add_links(safe, dfd, rel, links, names, files, found)
            if files or found:
                yield new(DirListing, (rel, names, files, tuple(found)))
    finally:
        walker.close()


def _held_back(plan: WalkPlan | None, held: dict[str, list[str]] | None, rel: str) -> bool:
    """Whether the subdirectory ``rel``, named in ``plan.held``, is held back: added to ``held``
    under the group ``plan.in_step_group`` places it in. False: walk it as usual."""
    if plan is None or held is None:
        return False
    group = plan.in_step_group(rel)
    if group is None:
        return False
    held.setdefault(group, []).append(rel)
    return True


def _walk_python(safe: SafeRoot, fd: int, start: str, plan: WalkPlan | None, holding: frozenset[str],
                 held: dict[str, list[str]] | None) -> Iterator[DirListing]:
    frames: list[tuple[int, str, Iterator[str]]] = [(fd, start, iter(()))]
    try:
        subdirs, listing = list_fd(safe, fd, start)
        frames[0] = (fd, start, iter(subdirs))
        if listing is not None:
            yield listing
        while frames:
            pfd, prel, names = frames[-1]
            name = next(names, None)
            if name is None:
                frames.pop()
                os.close(pfd)
                continue
            rel = f"{prel}/{name}" if prel else name
            if name in holding and _held_back(plan, held, rel):
                continue
            if too_deep(rel):
                yield DirListing(prel, [], [], ((name, TOO_DEEP),))
                continue
            try:
                cfd = os.open(name, DIR_FLAGS, dir_fd=pfd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                reason = dir_problem(safe, pfd, name, exc)
                if reason is not None:
                    yield DirListing(prel, [], [], ((name, reason),))
                continue
            try:
                subdirs, listing = list_fd(safe, cfd, rel)
            except OSError as exc:
                os.close(cfd)
                yield unreadable(rel, exc)
                continue
            frames.append((cfd, rel, iter(subdirs)))
            if listing is not None:
                yield listing
    finally:
        for frame in frames:
            os.close(frame[0])


def list_threaded(safe: SafeRoot, fd: int, start: str, workers: int) -> Iterator[DirListing]:
    """List the open directory ``fd`` (consumed) and everything below it with ``workers``
    threads, breadth first; each directory after the first is walked to from the root."""
    try:
        subdirs, listing = list_fd(safe, fd, start)
    finally:
        os.close(fd)
    if listing is not None:
        yield listing
    prefix_ = start + "/" if start else ""
    pending = [prefix_ + n for n in subdirs]
    # On Lustre/NFS every stat is a round trip to a metadata server: list many directories
    # at once. Batches keep the per-task overhead small next to the syscalls.
    with ThreadPoolExecutor(workers, thread_name_prefix="neffcache-list") as pool:
        running: set[Future[tuple[list[str], list[DirListing]]]] = set()
        while pending or running:
            while pending and len(running) < workers * 2:
                size = max(1, min(64, len(pending) // workers))
                batch, pending = pending[:size], pending[size:]
                running.add(pool.submit(list_rels, safe, batch))
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                more, listings = future.result()
                pending.extend(more)
                yield from listings
