"""What an index client does when its process forks or exits, held weakly.

A forked child inherits the client's buffers but not its sender thread: each registered
object's ``after_fork_in_child`` runs in the child so it starts its own thread when needed. At
interpreter exit, what is still buffered is put on disk (no network): the next process that
talks to the same index delivers it. Both hooks hold the object weakly, so an abandoned client
is collected and its hooks then do nothing.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import weakref
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)


class ForkAware(Protocol):
    def after_fork_in_child(self) -> None: ...


_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def track_forks(obj: ForkAware) -> None:
    """Call ``obj.after_fork_in_child()`` in every child this process forks while ``obj`` lives."""
    _LIVE.add(obj)


def _after_fork() -> None:
    for obj in list(_LIVE):
        obj.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork)


def at_exit(method: Callable[[], None]) -> Callable[[], None]:
    """Run the bound ``method`` at interpreter exit unless its object was collected; returns the
    hook to hand to :func:`atexit.unregister`. An OSError (the spool cannot be written) is logged."""
    hook = functools.partial(_call_weak, weakref.WeakMethod(method))
    atexit.register(hook)
    return hook


def _call_weak(ref: weakref.WeakMethod[Any]) -> None:
    method = ref()
    if method is not None:
        try:
            method()
        except OSError:
            log.warning("could not spool buffered index reports at exit", exc_info=True)
