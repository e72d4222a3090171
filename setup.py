"""The optional C extension, the one part of the build pyproject.toml cannot declare quietly.

neffcache/stores/_listdir.c is the listing loop of a local scan (the CPython C API and the
system's gcc and Python headers, nothing downloaded). It is optional: where it does not build
(no compiler, no headers) the install goes on and neffcache/stores/local_listing.py lists in
pure Python. Everything else about the build is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("neffcache.stores._listdir", sources=["neffcache/stores/_listdir.c"], optional=True,
                             extra_compile_args=["-O2", "-std=c11", "-D_GNU_SOURCE"])])
