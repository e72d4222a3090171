"""neffcache.failures: every failed compile gets a verdict (compiler error or environment) and a
signature that names the error whatever host, path or graph it hit."""

from __future__ import annotations

import errno

import pytest

from neffcache.failures import (
    FailureCause,
    FailureClass,
    Verdict,
    classify_exit,
    classify_text,
    error_lines,
    normalise,
    note,
    pattern,
    read_note,
    signature,
    signed_text,
)

SIM_ERROR = ("ERROR:neuronxcc: [NCC_ESIM001] Simulated compiler error in graph llama/b128/g1 (hlo sha256 "
             "9f86d081884c7d65): matched NEFFSIM_FAIL_MATCH at /tmp/a/b/model.hlo_module.pb:1234\n"
             "Compiler status ERROR")
LOADER = ("neuronx-cc: error while loading shared libraries: libfoo.so.1: cannot open shared object file: "
          "No such file or directory")


@pytest.mark.parametrize(("status", "output", "kwargs", "cause"), [
    (-9, "", {}, FailureCause.KILLED),
    (137, "", {}, FailureCause.KILLED),  # a shell between us and the compiler: 128 + SIGKILL
    (-15, "", {}, FailureCause.INTERRUPTED),
    (-2, "", {}, FailureCause.INTERRUPTED),
    (-11, "", {}, FailureCause.COMPILER_CRASH),
    (-6, "", {}, FailureCause.COMPILER_CRASH),
    (-6, "terminate called after throwing an instance of 'std::bad_alloc'", {}, FailureCause.OUT_OF_MEMORY),
    (1, "Traceback...\nMemoryError: Unable to allocate 3.2 GiB", {}, FailureCause.OUT_OF_MEMORY),
    (1, "OSError: [Errno 28] No space left on device: '/tmp/x'", {}, FailureCause.DISK_FULL),
    (127, LOADER, {}, FailureCause.MISSING_LIBRARY),
    (127, "sh: 1: exec: /opt/venv/bin/python: not found", {}, FailureCause.COMPILER_MISSING),
    (126, "", {}, FailureCause.START_FAILURE),
    (1, "ModuleNotFoundError: No module named 'neuronxcc.driver'", {}, FailureCause.START_FAILURE),
    (None, "....", {"timed_out": True}, FailureCause.TIMEOUT),
    (None, "", {"start_errno": errno.ENOENT, "start_error": "No such file"}, FailureCause.COMPILER_MISSING),
    (None, "", {"start_errno": errno.EACCES}, FailureCause.START_FAILURE),
    (1, SIM_ERROR, {}, FailureCause.COMPILER_ERROR),
    (70, "ERROR: [NCC_EVRF007] the compiler cannot allocate memory for tensor t0 in SBUF", {},
     FailureCause.COMPILER_ERROR),  # the compiler's own words about device memory: not the host's
    (0, "", {}, FailureCause.COMPILER_ERROR),  # exit 0 without a NEFF
])
def test_each_exit_gets_the_cause_of_the_module_rules(status: int | None, output: str, kwargs: dict[str, object],
                                                      cause: FailureCause) -> None:
    verdict = classify_exit(status, output, **kwargs)  # type: ignore[arg-type]
    assert verdict.cause is cause
    environment = cause not in (FailureCause.COMPILER_ERROR, FailureCause.COMPILER_CRASH)
    assert verdict.is_environment is environment
    assert verdict.failure_class is (FailureClass.ENVIRONMENT if environment else FailureClass.COMPILER)


@pytest.mark.parametrize(("text", "cause"), [
    ("Failed compilation with [...]: exit status -9", FailureCause.KILLED),
    ("subprocess.CalledProcessError: Command '[...]' died with <Signals.SIGKILL: 9>.", FailureCause.KILLED),
    ("... returned non-zero exit status 137.", FailureCause.KILLED),
    ("compiling...\nKilled\n", FailureCause.KILLED),
    ("Traceback (most recent call last):\nKeyboardInterrupt", FailureCause.INTERRUPTED),
    ("could not run neuronx-cc: [Errno 2] No such file or directory: 'neuronx-cc'", FailureCause.COMPILER_MISSING),
    (LOADER, FailureCause.MISSING_LIBRARY),
    ("exit status -11", FailureCause.COMPILER_CRASH),
    ("neuronx-cc exited 1: ERROR: internal error", FailureCause.COMPILER_ERROR),
    (SIM_ERROR, FailureCause.COMPILER_ERROR),
])
def test_a_text_alone_is_judged_by_what_it_says(text: str, cause: FailureCause) -> None:
    assert classify_text(text).cause is cause


@pytest.mark.parametrize("text", [
    # verify's error event before it carried a note, and as it sends it now
    "corrupt: model.neff does not match its manifest sha256 (0123456789ab… vs 9876543210fe…)",
    "corrupt: model.hlo_module.pb is missing",
    "corrupt: model.neff is missing\nneffcache-failure: corrupt-entry (storage): corrupt: model.neff is missing",
])
def test_a_corrupt_stored_entry_is_storage_never_the_compilers(text: str) -> None:
    verdict = classify_text(text)
    assert (verdict.cause, verdict.failure_class) == (FailureCause.CORRUPT_ENTRY, FailureClass.STORAGE)
    assert not verdict.is_environment  # nor the host's: no compile failed


def test_a_compiler_error_that_mentions_corrupt_stays_the_compilers() -> None:
    assert classify_text("ERROR: corrupt: HLO proto does not parse").failure_class is FailureClass.COMPILER


def test_neffcaches_note_wins_over_the_text_and_survives_a_round_trip() -> None:
    verdict = Verdict(FailureCause.KILLED, "neuronx-cc was killed by SIGKILL\nsecond line")
    line = note(verdict, "0123456789abcdef")
    assert "\n" not in line
    back = read_note(f"ERROR: looks like a compiler error\n{line}\n")
    assert back is not None and back.cause is FailureCause.KILLED
    assert classify_text(f"ERROR: looks like a compiler error\n{line}").cause is FailureCause.KILLED
    assert read_note("neffcache-failure: made-up (compiler): x") is None  # an unknown cause: the rules decide


def test_normalise_strips_what_differs_between_hosts_but_keeps_error_codes() -> None:
    line = ("2024-12-24 10:43:46.000413:  802783  ERROR [NCC_EVRF007] at /tmp/u/neuroncc_compile_workdir/"
            "c9e126d0-5133-47e2-8473-b29d4b875523/model.pb:12 tmpk0gh3biu 0xdeadbeef sha 9f86d081884c7d65")
    got = normalise(line)
    assert "NCC_EVRF007" in got
    for gone in ("802783", "/tmp", "c9e126d0", "tmpk0gh3biu", "deadbeef", "9f86d081", ":12"):
        assert gone not in got, got
    assert got.count("<path>") == 1 and "<tmp>" in got and got.count("<n>") == 10


def test_the_same_error_on_other_paths_graphs_and_lines_has_one_signature() -> None:
    other = (SIM_ERROR.replace("llama/b128/g1", "mistral/b4096/g7").replace("/tmp/a/b", "/fsx/cache/trn2-lnc2/x")
             .replace("1234", "77").replace("9f86d081884c7d65", "0badc0de12345678"))
    assert other != SIM_ERROR
    assert signature(other) == signature(SIM_ERROR)
    assert signature(SIM_ERROR.replace("NCC_ESIM001", "NCC_ESIM002")) != signature(SIM_ERROR)
    assert len(signature(SIM_ERROR)) == 16


def test_a_signed_text_keeps_its_signature_when_read_back() -> None:
    for status, output in ((1, SIM_ERROR), (-9, ""), (-11, "progress....."), (127, LOADER), (None, "")):
        verdict = classify_exit(status, output, timed_out=status is None)
        sig, text = signed_text(verdict, output)
        assert signature(text) == sig, (status, output)
        assert classify_text(text).cause is verdict.cause
    # A compiler error's signature does not depend on who wrote the record (note or none).
    assert signed_text(classify_exit(1, SIM_ERROR), SIM_ERROR)[0] == signature(SIM_ERROR)


def test_a_kill_groups_by_what_happened_not_by_its_partial_output() -> None:
    a = signed_text(classify_exit(-9, "step 1 ...."), "step 1 ....")[0]
    b = signed_text(classify_exit(-9, "step 7 ......"), "step 7 ......")[0]
    assert a == b == signature("Failed compilation with [...]: exit status -9")  # the runtime's record of it
    assert a != signed_text(classify_exit(-15, ""), "")[0]
    assert pattern(LOADER).startswith("missing-library: ")


def test_error_lines_pick_the_errors_and_leave_out_notes() -> None:
    text = f"INFO starting\nERROR one\nINFO more\nfatal two\n{note(Verdict(FailureCause.KILLED, 'x'))}\n"
    assert error_lines(text) == ["ERROR one", "fatal two"]
    assert error_lines("INFO a\nINFO last") == ["INFO last"]
    assert error_lines("") == []
