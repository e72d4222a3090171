"""Flags compared option by option: added, removed, changed, another spelling, another order, paths."""

from __future__ import annotations

from neffcache.misses.flagdiff import diff_flags, parse_flags


def test_an_option_and_its_value_in_two_tokens_are_one_flag() -> None:
    flags = parse_flags(["--model-type", "transformer", "--enable-saturate-infinity", "-O1", "--lnc=2"])
    assert [(f.name, f.value) for f in flags] == [("--model-type", "transformer"),
                                                 ("--enable-saturate-infinity", None), ("-O1", None), ("--lnc", "2")]


def test_same_flags_are_no_difference() -> None:
    diff = diff_flags(["--model-type=transformer", "--lnc=2"], ["--model-type=transformer", "--lnc=2"])
    assert diff.same and diff.count == 0


def test_one_flag_added_and_one_removed() -> None:
    diff = diff_flags(["--model-type=transformer", "--auto-cast=none"], ["--model-type=transformer", "-O2"])
    assert [f.spelling for f in diff.added] == ["-O2"]
    assert [f.spelling for f in diff.removed] == ["--auto-cast=none"]
    assert not diff.changed and not diff.same


def test_another_value_of_the_same_option_is_a_change_not_an_add_and_a_remove() -> None:
    diff = diff_flags(["--optlevel=1"], ["--optlevel=2"])
    assert not diff.added and not diff.removed
    (change,) = diff.changed
    assert (change.name, change.found, change.wanted, change.same_value) == ("--optlevel", "--optlevel=1",
                                                                              "--optlevel=2", False)


def test_another_spelling_of_the_same_value_is_reported_as_such() -> None:
    (change,) = diff_flags(["--model-type", "transformer"], ["--model-type=transformer"]).changed
    assert change.same_value and change.found == "--model-type transformer"


def test_the_same_flags_in_another_order_differ_for_a_key_that_hashes_them_as_written() -> None:
    diff = diff_flags(["--a=1", "--b=2"], ["--b=2", "--a=1"])
    assert diff.reordered and diff.count == 0 and not diff.same


def test_a_path_in_a_value_is_named() -> None:
    diff = diff_flags(["--logfile=/tmp/job-1/log.txt", "--lnc=2"], ["--logfile=/tmp/job-2/log.txt", "--lnc=2"])
    assert diff.path_flags() == ["--logfile"] and diff.changed[0].has_path
    assert diff_flags(["--lnc=1"], ["--lnc=2"]).path_flags() == []
    assert diff_flags([], ["--dump-dir", "~/dumps"]).path_flags() == ["--dump-dir"]


def test_a_repeated_option_is_paired_in_order() -> None:
    diff = diff_flags(["--x=1", "--x=2"], ["--x=1", "--x=3", "--x=4"])
    assert [c.wanted for c in diff.changed] == ["--x=3"] and [f.spelling for f in diff.added] == ["--x=4"]
    assert diff.to_json()["changed"][0]["option"] == "--x"
