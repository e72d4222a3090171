"""Shape-bucket matrices and shards: deterministic, disjoint, complete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neffcache.errors import ConfigError
from neffcache.warmers.matrix import Bucket, Shard, build_buckets, shard_buckets


def test_flags_make_the_product_in_the_order_given() -> None:
    buckets = build_buckets(["SEQ=128,512", "BATCH=1,4"])
    assert [b.name for b in buckets] == ["SEQ=128,BATCH=1", "SEQ=128,BATCH=4", "SEQ=512,BATCH=1", "SEQ=512,BATCH=4"]
    assert [b.index for b in buckets] == [0, 1, 2, 3]


def test_a_bucket_substitutes_arguments_and_sets_the_environment() -> None:
    bucket = Bucket(0, {"SEQ": "512", "BATCH": "4"})
    argv = bucket.command(["train.py", "--seq={SEQ}", "--batch", "{BATCH}", "--fmt={other}"])
    assert argv == ["train.py", "--seq=512", "--batch", "4", "--fmt={other}"]
    assert bucket.env() == {"SEQ": "512", "BATCH": "4", "NEFFCACHE_BUCKET": "SEQ=512,BATCH=4"}
    assert bucket.tags() == {"bucket": "SEQ=512,BATCH=4"}


def test_no_buckets_is_one_default_bucket_and_a_bare_list_gets_a_key() -> None:
    assert [b.name for b in build_buckets()] == ["default"]
    assert [b.values for b in build_buckets(["128,256"])] == [{"BUCKET": "128"}, {"BUCKET": "256"}]


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_matrix_files(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"m{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps({"matrix": {"SEQ": [128, 512]}, "include": [{"SEQ": 2048, "MODE": "x"}]}))
    else:
        path.write_text('matrix = { SEQ = [128, 512] }\ninclude = [ { SEQ = 2048, MODE = "x" } ]\n')
    assert [b.name for b in build_buckets(matrix_file=path)] == ["SEQ=128", "SEQ=512", "SEQ=2048,MODE=x"]


@pytest.mark.parametrize("content", ['{"matrix": {"SE Q": [1]}}', '{"matrix": {"A": [true]}}', "[]", "{nope",
                                     '{"what": 1}'])
def test_bad_matrix_files_are_clear_errors(tmp_path: Path, content: str) -> None:
    path = tmp_path / "m.json"
    path.write_text(content)
    with pytest.raises(ConfigError):
        build_buckets(matrix_file=path)


def test_flags_and_file_together_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text('{"matrix": {"A": [1]}}')
    with pytest.raises(ConfigError, match="not both"):
        build_buckets(["A=2"], path)


@pytest.mark.parametrize("text", ["4/4", "1", "a/b", "-1/2", "0/0"])
def test_bad_shards(text: str) -> None:
    with pytest.raises(ConfigError, match="shard"):
        Shard.parse(text)


def test_shards_split_buckets_and_graphs_disjointly_and_completely() -> None:
    buckets = build_buckets(["SEQ=" + ",".join(str(2**i) for i in range(10))])
    parts = [shard_buckets(buckets, Shard.parse(f"{i}/3")) for i in range(3)]
    assert sorted(b.index for part in parts for b in part) == list(range(10))
    assert [len(p) for p in parts] == [4, 3, 3]
    names = [f"trn2-lnc2/neuronxcc-2.27/MODULE_{i}+d41d8cd9" for i in range(200)]
    owners = [[n for n in names if Shard(i, 4).owns_name(n)] for i in range(4)]
    assert sorted(n for part in owners for n in part) == sorted(names)
    assert all(20 < len(part) < 80 for part in owners)  # roughly even
