"""/v1/failures: a window's error events grouped by signature with the library's own rules."""

from __future__ import annotations

import time

import httpx

from neffcache.failures import Verdict, classify_exit, signature, signed_text
from neffcache.server.services.failures import FailuresQuery, failure_groups
from tests.server.conftest import LiveServer
from tests.server.factories import NAMESPACE, event

V2 = {"compiler_version": "2.28.1001.0+0badc0de", "target": "trn2", "lnc": 2}


def _compiler_error(path: str, line: int) -> str:
    output = (f"ERROR:neuronxcc: [NCC_ESIM001] Simulated compiler error in graph llama/b{line}/g1 (hlo sha256 "
              f"{line:016x}): matched NEFFSIM_FAIL_MATCH at {path}:{line}\nCompiler status ERROR")
    return signed_text(classify_exit(1, output), output)[1]


def _events(now: float) -> list[dict[str, object]]:
    killed: Verdict = classify_exit(-9, "")
    return [
        event("error", path=f"{NAMESPACE}/MODULE_1+aa", ts=now - 60, message=_compiler_error("/fsx/a/x.pb", 12)),
        event("error", path=f"{NAMESPACE}/MODULE_2+aa", ts=now - 30, model="mistral", team="ads", toolchain=V2,
              message=_compiler_error("/tmp/u/w/c9e126d0/model.pb", 4077)),
        event("error", path=f"{NAMESPACE}/MODULE_2+aa", ts=now - 20, model="mistral", team="ads",
              message=_compiler_error("/tmp/u/w/other/model.pb", 4077)),
        event("error", path=f"{NAMESPACE}/MODULE_3+aa", ts=now - 10, message=signed_text(killed, "")[1]),
        event("hit", path=f"{NAMESPACE}/MODULE_4+aa", ts=now - 5),
        event("error", path=f"{NAMESPACE}/MODULE_5+aa", ts=now - 3 * 86400, message="ERROR: old news"),
    ]


def test_error_events_are_grouped_by_signature(writer: httpx.Client, reader: httpx.Client) -> None:
    now = time.time()
    writer.post("/v1/events", json=_events(now)).raise_for_status()
    body = reader.get("/v1/failures", params={"window": "1d"}).json()
    assert body["events"] == 4 and body["truncated"] is False
    big, env = body["groups"]
    assert big["signature"] == signature(_compiler_error("/anywhere", 1))
    assert (big["class"], big["cause"]) == ("compiler", "compiler-error")
    assert (big["graphs"], big["occurrences"]) == (2, 3)
    assert big["models"] == ["llama3-8b", "mistral"] and big["teams"] == ["ads", "search"]
    assert big["compiler_versions"] == ["2.27.5334.0+f702b353", "2.28.1001.0+0badc0de"]
    assert big["first_seen"] < big["last_seen"] and "<path>" in big["pattern"]
    assert (env["class"], env["cause"], env["graphs"]) == ("environment", "killed", 1)
    assert reader.get("/v1/failures", params={"window": "4d"}).json()["events"] == 5
    assert len(reader.get("/v1/failures", params={"window": "1d", "top": 1}).json()["groups"]) == 1


def test_failures_need_a_token_and_a_valid_window(server: LiveServer, reader: httpx.Client) -> None:
    with server.client() as anonymous:
        assert anonymous.get("/v1/failures").status_code == 401
    assert reader.get("/v1/failures", params={"window": "forever"}).status_code == 422
    assert reader.get("/v1/failures", params={"top": 0}).status_code == 422
    assert reader.get("/v1/failures").json()["groups"] == []


def test_the_query_is_bounded_and_says_so(writer: httpx.Client, server: LiveServer) -> None:
    now = time.time()
    writer.post("/v1/events", json=_events(now)).raise_for_status()
    with server.db.read() as session:
        out = failure_groups(session, FailuresQuery(start=now - 86400, end=now + 1, max_events=2))
    assert out.truncated and out.events == 2
    assert {g.cause for g in out.groups} == {"killed", "compiler-error"}  # the newest two events
