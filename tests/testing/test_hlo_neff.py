"""The fake HLO and NEFF formats: deterministic, distinct per graph, cheap to generate."""

from __future__ import annotations

import hashlib
import time

from neffcache.testing.hlo import graph_name_of, make_hlo, read_hlo_header
from neffcache.testing.neff import (
    MAX_NEFF_BYTES,
    MIN_NEFF_BYTES,
    build_neff,
    default_neff_size,
    read_neff_header,
)


def test_hlo_is_deterministic_and_distinct_per_graph() -> None:
    a = make_hlo("llama-tiny", 128, 0, 20_000)
    assert a == make_hlo("llama-tiny", 128, 0, 20_000)
    assert len(a) == 20_000
    others = {make_hlo("llama-tiny", 128, 1, 20_000), make_hlo("llama-tiny", 256, 0, 20_000),
              make_hlo("llama-small", 128, 0, 20_000), make_hlo("llama-tiny", 128, 0, 30_000)}
    assert a not in others and len(others) == 4


def test_hlo_header_names_the_graph() -> None:
    hlo = make_hlo("bert", 512, 3, 14_000, compile_seconds=1.5)
    assert graph_name_of(hlo) == "bert/b512/g3"
    header = read_hlo_header(hlo)
    assert header is not None
    assert header["compile_seconds"] == 1.5
    assert graph_name_of(b"\x08\x01real protobuf") is None
    assert graph_name_of(b"HLOSIM1\n{not json") is None


def test_large_hlo_and_neff_are_fast() -> None:
    start = time.perf_counter()
    hlo = make_hlo("big", 1, 0, 8_700_000)
    neff = build_neff(hlo, compiler_version="2.27.5334.0+f702b353", target="trn2", lnc=2, flags=[],
                      size=MAX_NEFF_BYTES)
    assert time.perf_counter() - start < 0.5  # generous: each alone is a few ms
    assert len(hlo) == 8_700_000 and len(neff) == MAX_NEFF_BYTES


def test_neff_header_and_default_size() -> None:
    hlo = make_hlo("m", 1, 0, 20_000)
    neff = build_neff(hlo, compiler_version="2.27.1.0+abc", target="trn1", lnc=1, flags=["-O2", "--a=b"])
    header = read_neff_header(neff)
    assert header is not None
    assert header["hlo_sha256"] == hashlib.sha256(hlo).hexdigest()
    assert header["flags"] == ["--a=b", "-O2"]
    assert (header["target"], header["lnc"], header["graph"]) == ("trn1", 1, None)
    assert len(neff) == default_neff_size(len(hlo)) == 200_000
    assert default_neff_size(10) == MIN_NEFF_BYTES
    assert default_neff_size(10**9) == MAX_NEFF_BYTES
    assert read_neff_header(hlo) is None
