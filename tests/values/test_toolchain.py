from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neffcache import keys
from neffcache.errors import ConfigError, InvalidKey, ToolchainError, UnknownInstanceType
from neffcache.instances import CATALOG, lookup_instance
from neffcache.keys import cache_key, key_parts, safe_relpath
from neffcache.toolchain import Toolchain, parse_compiler_version

REAL_OUTPUT = """NeuronX Compiler version 2.27.5334.0+f702b353

Python version 3.10.12
HWM version 2.27.5334.0+f702b353
NumPy version 1.25.2

Running on AMI ami-0123
Running in region usw2-az4
"""


def test_parse_real_version_output() -> None:
    assert parse_compiler_version(REAL_OUTPUT) == "2.27.5334.0+f702b353"
    with pytest.raises(ToolchainError, match="cannot read a compiler version"):
        parse_compiler_version("neuronx-cc: command failed\n")


@pytest.mark.parametrize(("instance", "target", "lnc"), [
    ("trn1.2xlarge", "trn1", 1), ("trn1n.32xlarge", "trn1", 1), ("inf2.48xlarge", "trn1", 1),
    ("trn2.48xlarge", "trn2", 2), ("trn2u.48xlarge", "trn2", 2), ("trn2.3xlarge", "trn2", 2),
    (" TRN2.48xlarge ", "trn2", 2),
])
def test_catalog(instance: str, target: str, lnc: int) -> None:
    row = lookup_instance(instance)
    assert (row.target, row.default_lnc) == (target, lnc)
    tc = Toolchain.for_instance(instance, "2.27.1.0")
    assert tc.target_dir == f"{target}-lnc{lnc}"


def test_catalog_covers_the_facts_table() -> None:
    for name in ["trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge", "inf2.xlarge", "inf2.8xlarge",
                 "inf2.24xlarge", "inf2.48xlarge", "trn2.3xlarge", "trn2.48xlarge", "trn2u.48xlarge"]:
        assert name in CATALOG


def test_unknown_instance_names_known_ones() -> None:
    with pytest.raises(UnknownInstanceType) as err:
        lookup_instance("p4d.24xlarge")
    assert "trn2.48xlarge" in str(err.value) and "p4d.24xlarge" in str(err.value)


def test_bad_toolchains() -> None:
    with pytest.raises(ConfigError):
        Toolchain("../../etc", "trn2", 2)
    with pytest.raises(ConfigError):
        Toolchain("2.27", "trn9", 2)
    with pytest.raises(ConfigError):
        Toolchain("2.27", "trn2", 3)


def test_key_covers_every_input() -> None:
    tc = Toolchain("2.27.1.0", "trn2", 2)
    base = cache_key(b"hlo", ["--a", "--b"], tc)
    assert base == cache_key(b"hlo", ["--b", "--a"], tc)  # flag order does not matter
    variants = [
        cache_key(b"hlo2", ["--a", "--b"], tc),
        cache_key(b"hlo", ["--a"], tc),
        cache_key(b"hlo", ["--a", "--b"], Toolchain("2.27.2.0", "trn2", 2)),
        cache_key(b"hlo", ["--a", "--b"], Toolchain("2.27.1.0", "trn1", 2)),
        cache_key(b"hlo", ["--a", "--b"], Toolchain("2.27.1.0", "trn2", 1)),
        cache_key(b"hlo", ["--a --b"], tc),  # no boundary forgery
    ]
    assert len({base, *variants}) == 7
    diff = key_parts(b"hlo", ["--a"], tc).diff(key_parts(b"hlo", ["--a"], Toolchain("2.28.0.0", "trn2", 2)))
    assert diff == ["compiler_version: '2.28.0.0' -> '2.27.1.0'"]


@pytest.mark.parametrize("bad", ["../x", "a/../../x", "/etc/passwd", "C:/x", "a\\b", "a\nb", "a/b c", "", "./.."])
def test_safe_relpath_rejects(bad: str) -> None:
    with pytest.raises(InvalidKey):
        safe_relpath(bad)


def test_safe_relpath_normalises() -> None:
    assert safe_relpath("./a//b/") == "a/b"
    assert safe_relpath("trn2-lnc2/neuronxcc-2.27.5334.0+f702b353/MODULE_1+ab") == (
        "trn2-lnc2/neuronxcc-2.27.5334.0+f702b353/MODULE_1+ab")


# Paths built from the characters that matter to the checks: separators, dots, a drive colon,
# backslash, control and non-ASCII characters, beside ordinary component characters.
_PATHS = st.one_of(st.text(alphabet=st.sampled_from(list("ab09_.+=@,-/:\\\x00\n\x7f é")), max_size=24),
                   st.lists(st.sampled_from(["a", ".", "..", "...", "", ".a", "a.", "b+c"]), max_size=6).map("/".join))


@settings(max_examples=3000, deadline=None)
@given(_PATHS)
def test_safe_relpath_fast_path_agrees_with_every_check(path: str) -> None:
    """The one-regex path for canonical paths answers as the check-by-check path does: the same
    path back, or the same refusal."""
    try:
        expected: str | None = keys._checked_relpath(path)
    except InvalidKey:
        expected = None
    if expected is None:
        with pytest.raises(InvalidKey):
            safe_relpath(path)
    else:
        assert safe_relpath(path) == expected
    # Canonical means accepted unchanged, and only that.
    assert keys.is_canonical_relpath(path) == (expected == path)
