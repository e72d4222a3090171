"""``python -m tests.hostile.nodac ARGS``: the neffcache CLI without the capabilities that let
root read any directory (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so a ``chmod 000``
directory is unreadable to it as it is to any other user. The tests run as root."""

from __future__ import annotations

import ctypes
import sys

_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2
_VERSION_3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_dac() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _Header(_VERSION_3, 0), (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        return False
    keep = ~((1 << _CAP_DAC_OVERRIDE) | (1 << _CAP_DAC_READ_SEARCH)) & 0xFFFFFFFF
    for d in data:
        d.effective &= keep
        d.permitted &= keep
        d.inheritable &= keep
    return libc.capset(ctypes.byref(header), data) == 0


if __name__ == "__main__":
    if not drop_dac():
        sys.exit(99)
    from neffcache.cli.main import main

    sys.argv = ["neffcache", *sys.argv[1:]]
    main()
