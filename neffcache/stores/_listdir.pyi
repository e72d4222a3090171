"""Types of the C listing helper (neffcache/stores/_listdir.c)."""

from collections.abc import Iterator

from neffcache.entry import FileInfo
from neffcache.stores.plain import CountedTop

# (subdirectory names, file names, their FileInfos, symlink names, special files' (name, reason))
Listed = tuple[list[str], list[str], list[FileInfo], list[str], tuple[tuple[str, str], ...]]
# (directory, file names, their FileInfos, symlink names, problems, the directory's descriptor,
#  how many subdirectories the walk will enter, the names of those it holds back)
Step = tuple[str, list[str], list[FileInfo], list[str], tuple[tuple[str, str], ...], int, int, tuple[str, ...]]

MAX_DEPTH: int  # directory levels the Walker enters (local_listing.MAX_DEPTH)
MAX_LARGEST: int  # the most ``largest`` entries a count reports (count_plain's, WalkPlan.largest)

def list_dir(fd: int, prefix: str, info_type: type[FileInfo], /) -> Listed: ...

class Walker(Iterator[Step]):
    def __init__(self, fd: int, start: str, info_type: type[FileInfo], held: frozenset[bytes] | None = None,
                 steered: bool = False) -> None: ...
    def __next__(self) -> Step: ...
    def close(self) -> None: ...
    # (entries, bytes, files, the ``largest`` entries counted)
    def count_children(self, prefix: str, charset: str, names: tuple[str, ...], required: tuple[str, ...],
                       primary: str, largest: int, /) -> tuple[int, int, int, CountedTop]: ...
    def release(self, name: str, /) -> None: ...

# (entries, bytes, files, the names of the children declined, the ``largest`` entries counted)
Counted = tuple[int, int, int, list[str], CountedTop]

def count_plain(parents: tuple[int, ...], primary: tuple[bool, ...], children: list[tuple[str, int]], prefix: str,
                suffixes: tuple[str, ...], primary_suffix: str, key_min: int, key_max: int, largest: int = 0,
                directories: tuple[str, ...] = (), /) -> Counted: ...
