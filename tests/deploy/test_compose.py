"""deploy/compose.yaml: its commands, flags, ports and environment are ones the code reads,
checked statically and by running the index and the warmer with them (conftest.compose_stack)."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from tests.deploy.commands import neffcache_argvs, parse_invocation
from tests.deploy.conftest import ComposeStack
from tests.deploy.files import (
    COMPOSE,
    DEPLOY,
    SERVER_DOCKERFILE,
    compose,
    compose_argv,
    compose_environment,
    compose_services_built_from,
    image_defaults,
)
from tests.deploy.settings import read_by_code, server_settings_from_env

SERVICES: dict[str, Any] = compose()["services"]


def _index_port() -> int:
    inv = parse_invocation(compose_argv(SERVICES["index"], SERVER_DOCKERFILE))
    assert inv.path == ("serve",)
    port: int = inv.params["port"]
    return port


def test_the_stack_has_every_part() -> None:
    assert {"index", "postgres", "s3", "s3-bucket", "prometheus", "grafana", "warmer", "upgrade"} <= set(SERVICES)
    built = compose_services_built_from(SERVER_DOCKERFILE)
    assert set(built) == {"index", "warmer", "upgrade"}


def test_index_command_and_settings() -> None:
    index = SERVICES["index"]
    inv = parse_invocation(compose_argv(index, SERVER_DOCKERFILE))
    assert inv.params["host"] == "0.0.0.0"
    port = inv.params["port"]
    assert [p.rsplit(":", 1)[-1] for p in index["ports"]] == [str(port)]
    assert all(p.startswith("127.0.0.1:") for s in SERVICES.values() for p in s.get("ports", []))
    env = compose_environment(index)
    settings = server_settings_from_env(env)
    assert settings.anonymous_read  # Prometheus scrapes without a token on this one host
    url = settings.resolved_database_url()
    postgres = SERVICES["postgres"]["environment"]
    assert url == (f"postgresql+psycopg://{postgres['POSTGRES_USER']}:neffcache@postgres:5432/"
                   f"{postgres['POSTGRES_DB']}")
    # `depends_on: service_healthy` on the index needs the image's HEALTHCHECK, on the same port.
    assert any(d.get("condition") == "service_healthy" for d in SERVICES["warmer"]["depends_on"].values())
    assert f":{port}/healthz" in " ".join(image_defaults(SERVER_DOCKERFILE).healthcheck)


def test_every_neffcache_env_var_is_read_by_the_code() -> None:
    for name in compose_services_built_from(SERVER_DOCKERFILE):
        for var in compose_environment(SERVICES[name]):
            assert read_by_code(var), f"compose service {name} sets {var}, which nothing reads"


def test_warmer_commands_parse_and_point_at_the_stack() -> None:
    warmer = SERVICES["warmer"]
    env = compose_environment(warmer)
    argv = compose_argv(warmer, SERVER_DOCKERFILE)
    assert argv[:2] == ["/bin/sh", "-c"]
    (warm,) = [parse_invocation(a) for a in neffcache_argvs(argv[2], env)]
    assert warm.path == ("warm",)
    assert warm.params["instance"] == "trn2.48xlarge"
    s3_stores = [s for s in warm.params["stores"] if s.startswith("s3://")]
    bucket_script = SERVICES["s3-bucket"]["entrypoint"][2]
    assert s3_stores and all(f'Bucket="{s.split("/")[2]}"' in bucket_script for s in s3_stores)
    assert env["NEFFCACHE_INDEX_URL"] == f"http://index:{_index_port()}"
    assert env["AWS_ENDPOINT_URL"] in bucket_script
    assert env["NEFFCACHE_TOKEN"] == compose_environment(SERVICES["index"])["NEFFCACHE_SERVER_ADMIN_TOKEN"]


def test_upgrade_commands_play_the_playbook_on_the_warmers_stores() -> None:
    env = compose_environment(SERVICES["upgrade"])
    argv = compose_argv(SERVICES["upgrade"], SERVER_DOCKERFILE)
    rewarm, report = [parse_invocation(a) for a in neffcache_argvs(argv[2], env)]
    (warm,) = [parse_invocation(a) for a in neffcache_argvs(compose_argv(SERVICES["warmer"], SERVER_DOCKERFILE)[2],
                                                              compose_environment(SERVICES["warmer"]))]
    assert (rewarm.path, report.path) == (("rewarm",), ("upgrade-report",))
    assert rewarm.params["stores"] == report.params["stores"] == warm.params["stores"]
    assert rewarm.params["from_version"] == report.params["from_version"]
    new_version = re.search(r"--version (\S+)", argv[2])
    assert new_version and report.params["to_version"] == new_version.group(1) != report.params["from_version"]
    assert report.params["gate"] == 0.95
    assert env["NEFFCACHE_INDEX_URL"] == compose_environment(SERVICES["warmer"])["NEFFCACHE_INDEX_URL"]


def test_prometheus_and_grafana_wiring() -> None:
    prometheus_cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = prometheus_cfg["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"index:{_index_port()}"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in SERVICES["prometheus"]["volumes"]}
    for rule_file in prometheus_cfg["rule_files"]:
        assert rule_file in mounts and (COMPOSE.parent / mounts[rule_file]).is_file()
    assert "--config.file=/etc/prometheus/prometheus.yml" in SERVICES["prometheus"]["command"]

    grafana = SERVICES["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    datasources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    (source,) = datasources["datasources"]
    assert source["url"] == "http://prometheus:9090"
    assert any(p.endswith(":9090") for p in SERVICES["prometheus"]["ports"])
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/neffcache.yaml").read_text())
    folder = providers["providers"][0]["options"]["path"]
    dashboards = [target for target in mounts if target.startswith(folder + "/")]
    assert dashboards and all((COMPOSE.parent / mounts[d]).is_file() for d in dashboards)
    assert grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] in dashboards
    # The dashboard's datasource variable defaults to the provisioned datasource's uid.
    dashboard = json.loads((COMPOSE.parent / mounts[dashboards[0]]).read_text())
    (ds_var,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert ds_var["current"]["value"] == source["uid"]


def test_compose_stack_runs(compose_stack: ComposeStack) -> None:
    server = compose_stack.server
    assert server.get("/healthz").status_code == 200
    assert server.get("/readyz").json()["status"] == "ok"
    assert compose_stack.bucket_run.returncode == 0, compose_stack.bucket_run.stderr
    first, second = compose_stack.warm_runs
    for run in (first, second):
        assert run.returncode == 0, run.stdout + run.stderr
    # The second run of `docker compose run warmer` compiles nothing: it is all cache hits.
    metrics = compose_stack.metrics()
    hits = sum(float(v) for v in re.findall(r'^neffcache_cache_events_total\{[^}]*kind="hit"[^}]*\} (\S+)$',
                                             metrics, re.M))
    assert hits >= 12, metrics  # 3 buckets x 4 graphs
    assert re.search(r'^neffcache_entry_bytes\{toolchain="[^"]*trn2[^"]*"\} [1-9]', metrics, re.M), metrics
    # `docker compose run upgrade`: every graph rewarmed, the gate met, the pair's readiness exported.
    upgrade = compose_stack.upgrade_run
    assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr
    assert "readiness    100.0%  (12 of 12 graphs ready" in upgrade.stdout and "gate 95.0%: ready" in upgrade.stdout
    assert re.search(r'^neffcache_upgrade_readiness\{[^}]*\} 1\.0$', metrics, re.M), metrics
    assert re.search(r'^neffcache_compile_cost_total\{[^}]*currency="USD"[^}]*\} (?!0\.0$)[0-9.e+-]+$', metrics,
                     re.M), metrics  # priced: the warm-ups reported trn2.48xlarge, which compose prices
