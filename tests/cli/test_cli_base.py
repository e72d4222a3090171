"""The CLI base: help everywhere, one-line errors, JSON, scan/verify/env/config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from neffcache.application.config import load_settings
from neffcache.cli.main import cli
from neffcache.errors import ConfigError
from neffcache.testing.store_contract import publish_a
from tests.runtime_caches import write_neuronxcc_entry

VERSION = "2.27.5334.0+f702b353"


def all_commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    out = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        out.append((f"{prefix}{name}", cmd))
        if isinstance(cmd, click.Group):
            out.extend(all_commands(cmd, f"{prefix}{name} "))
    return out


@pytest.mark.parametrize(("name", "command"), all_commands(cli), ids=lambda v: v if isinstance(v, str) else "")
def test_every_command_has_help_with_an_example(name: str, command: click.Command) -> None:
    result = CliRunner().invoke(cli, [*name.split(), "--help"], catch_exceptions=False)
    assert result.exit_code == 0
    assert command.help, f"{name} has no help text"
    if not isinstance(command, click.Group):
        assert "Example" in result.output, f"`neffcache {name} --help` shows no example"


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and "neffcache" in result.output


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it (errors go through main())."""
    return subprocess.run([sys.executable, "-m", "neffcache.cli.main", *args], capture_output=True,
                          text=True, env=env, check=False)


def test_errors_are_one_line_with_exit_codes(tmp_path: Path) -> None:
    bad_instance = run_cli("env", "--instance", "p4d.24xlarge", "--compiler-version", VERSION, "--store", str(tmp_path))
    assert bad_instance.returncode == 2
    assert bad_instance.stderr.strip().splitlines()[0].startswith("neffcache: unknown instance type")
    assert "trn2.48xlarge" in bad_instance.stderr and "Traceback" not in bad_instance.stderr
    missing = run_cli("scan", str(tmp_path / "nope"))
    assert missing.returncode == 4 and "does not exist" in missing.stderr
    bad_url = run_cli("scan", "fsx://relative")
    assert bad_url.returncode == 2 and "bad store URL" in bad_url.stderr


def test_scan_json_and_text(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    write_neuronxcc_entry(root, b"a")
    write_neuronxcc_entry(root, b"b", state="FAILED")
    (root / "stray.neffcache-tmp-abc").write_bytes(b"x")
    runner = CliRunner()
    result = runner.invoke(cli, ["scan", str(root), "--json", "--entries"], catch_exceptions=False)
    data = json.loads(result.output)
    assert data["entries"] == 2 and data["states"]["SUCCESS"] == 1 and data["states"]["FAILED"] == 1
    assert data["garbage"]["files"] == 1
    assert {e["state"] for e in data["entry_list"]} == {"SUCCESS", "FAILED"}
    text = runner.invoke(cli, ["scan", str(root)], catch_exceptions=False).output
    assert "neuronxcc-2.21.33363.0+82129205" in text and "garbage: 1" in text


def test_verify_exit_codes_and_fix(tmp_path: Path) -> None:
    from neffcache.stores.local import LocalStore

    store = LocalStore(tmp_path / "c")
    path, neff = publish_a(store)
    runner = CliRunner()
    ok = runner.invoke(cli, ["verify", str(store.root), "--json"], catch_exceptions=False)
    assert ok.exit_code == 0 and json.loads(ok.output)["ok"] == 1
    (store.root / path / "model.neff").write_bytes(b"Z" * len(neff))
    bad = runner.invoke(cli, ["verify", str(store.root)], catch_exceptions=False)
    assert bad.exit_code == 5 and "CORRUPT" in bad.output
    fixed = runner.invoke(cli, ["verify", str(store.root), "--fix", "--json"], catch_exceptions=False)
    assert fixed.exit_code == 0 and json.loads(fixed.output)["problems"][0]["quarantined_to"]
    assert not (store.root / path / "model.done").exists()


def test_env_shells(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["env", "--instance", "trn1.32xlarge", "--compiler-version", VERSION, "--store", str(tmp_path)]
    bash = runner.invoke(cli, args, catch_exceptions=False).output
    assert f"export NEURON_COMPILE_CACHE_URL={tmp_path}/trn1-lnc1" in bash
    assert "export NEURON_LOGICAL_NC_CONFIG=1" in bash
    fish = runner.invoke(cli, [*args, "--shell", "fish"], catch_exceptions=False).output
    assert f"set -gx NEURON_COMPILE_CACHE_URL {tmp_path}/trn1-lnc1;" in fish
    data = json.loads(runner.invoke(cli, [*args, "--shell", "json"], catch_exceptions=False).output)
    assert data["toolchain"] == {"compiler_version": VERSION, "target": "trn1", "lnc": 1}
    assert data["env"]["TORCH_NEURONX_NEFF_CACHE_DIR"].endswith(f"trn1-lnc1/torchneuron-{VERSION}/neff")
    s3 = json.loads(runner.invoke(cli, ["env", "--instance", "trn2.48xlarge", "--compiler-version", VERSION,
                                        "--store", "s3://bucket/cache", "--shell", "json"]).output)
    assert s3["env"]["NEURON_COMPILE_CACHE_URL"] == "s3://bucket/cache/trn2-lnc2"
    assert "TORCH_NEURONX_NEFF_CACHE_DIR" not in s3["env"] and s3["notes"]


def test_env_runs_the_compiler_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from neffcache.testing.shim import install_compiler_shim

    bin_dir = tmp_path / "bin"
    install_compiler_shim(bin_dir, version="2.28.1.0+abcdef12")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    out = CliRunner().invoke(cli, ["env", "--instance", "trn2.48xlarge", "--store", str(tmp_path)],
                             catch_exceptions=False).output
    assert "trn2-lnc2/torchneuron-2.28.1.0+abcdef12/neff" in out


def test_config_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = tmp_path / "home" / ".config" / "neffcache"
    user.mkdir(parents=True)
    (user / "neffcache.toml").write_text('instance = "trn1.2xlarge"\nstores = ["/user/store"]\nparallel = 2\n')
    project = tmp_path / "proj"
    project.mkdir()
    (project / "neffcache.toml").write_text('[neffcache]\ninstance = "trn2.48xlarge"\ntags = { team = "llm" }\n')
    monkeypatch.chdir(project)
    s = load_settings()
    assert (s.instance, s.stores, s.parallel, dict(s.tags)) == ("trn2.48xlarge", ("/user/store",), 2, {"team": "llm"})
    monkeypatch.setenv("NEFFCACHE_STORES", "/a, s3://b/c")
    monkeypatch.setenv("NEFFCACHE_TAGS", "team=infra,model=llama")
    s = load_settings(instance="inf2.xlarge")
    assert s.stores == ("/a", "s3://b/c") and s.instance == "inf2.xlarge"
    assert dict(s.tags) == {"team": "infra", "model": "llama"}
    (project / "neffcache.toml").write_text("bogus = 1\n")
    with pytest.raises(ConfigError, match="unknown settings bogus"):
        load_settings()
    (project / "neffcache.toml").write_text("instance = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings()
    monkeypatch.setenv("NEFFCACHE_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings()


def test_failed_ttl_from_the_file_the_environment_and_a_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_settings().failed_ttl is None  # by default a compiler error stands, as the runtime has it
    (tmp_path / "neffcache.toml").write_text('failed_ttl = "7d"\n')
    assert load_settings().failed_ttl == 7 * 86400
    monkeypatch.setenv("NEFFCACHE_FAILED_TTL", "12h")
    assert load_settings().failed_ttl == 12 * 3600
    assert load_settings(failed_ttl=60.0).failed_ttl == 60.0
    for bad in ("0", "soon", "-1d"):
        monkeypatch.setenv("NEFFCACHE_FAILED_TTL", bad)
        with pytest.raises(ConfigError, match="failed_ttl"):
            load_settings()
    monkeypatch.delenv("NEFFCACHE_FAILED_TTL")
    (tmp_path / "neffcache.toml").write_text("failed_ttl = true\n")
    with pytest.raises(ConfigError, match="failed_ttl"):
        load_settings()


def test_show_entry(tmp_path: Path) -> None:
    from neffcache.stores.local import LocalStore

    store = LocalStore(tmp_path / "c")
    path, _ = publish_a(store)
    runner = CliRunner()
    data = json.loads(runner.invoke(cli, ["show", str(store.root), path, "--json"], catch_exceptions=False).output)
    assert data["state"] == "SUCCESS" and data["manifest"]["tags"] == {"model": "llama"}
    text = runner.invoke(cli, ["show", str(store.root), path], catch_exceptions=False).output
    assert "neuronxcc-2.27.5334.0+f702b353 trn2 lnc=2" in text and "compile 12.5 s" in text
    missing = run_cli("show", str(store.root), "trn2-lnc2/neuronxcc-2.27.5334.0+f702b353/MODULE_0+0")
    assert missing.returncode == 4 and "no entry" in missing.stderr
    traversal = run_cli("show", str(store.root), "../../etc/passwd")
    assert traversal.returncode == 2 and "invalid key" in traversal.stderr


@pytest.mark.parametrize("command", ["warm", "run"])
def test_mistyped_option_is_not_run_as_the_workload(command: str) -> None:
    result = CliRunner().invoke(cli, [command, "--instance", "trn2.48xlarge", "--bogus", "--", "python", "x.py"])
    assert result.exit_code == 2
    assert "no such option: --bogus" in result.output
    empty = CliRunner().invoke(cli, [command, "--instance", "trn2.48xlarge", "--"])
    assert empty.exit_code == 2


def test_the_lazy_command_table_names_each_modules_commands() -> None:
    """cli/main.py names each module's commands so it need not import them all: the table and
    the modules' COMMANDS are the same, name for name, and every command is reachable."""
    import importlib

    from neffcache.cli.main import COMMAND_MODULES

    for module, names in COMMAND_MODULES.items():
        assert sorted(c.name for c in importlib.import_module(module).COMMANDS) == sorted(names), module
    listed = cli.list_commands(click.Context(cli))
    assert len(listed) == len(set(listed)) == sum(len(n) for n in COMMAND_MODULES.values())


def test_a_command_runs_without_importing_the_others() -> None:
    """`neffcache scan` imports what a scan needs, not the compiler drivers, the prune planner
    or the server (0.9 s of CPU on every invocation before)."""
    import subprocess
    import sys

    others = ("neffcache.cli.warm", "neffcache.cli.prune", "neffcache.cli.server", "neffcache.warmers.warm",
              "neffcache.prune.plan", "neffcache.server.app")
    probe = ("import sys; from neffcache.cli.main import cli; "
             "cli.main(['scan', '--help'], standalone_mode=False); "
             f"print('loaded:', [m for m in {others!r} if m in sys.modules], 'neffcache.cli.scan' in sys.modules, "
             "file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "Usage: " in done.stdout and "scan" in done.stdout
    assert done.stderr.strip() == "loaded: [] True"


def test_help_needs_no_signing_key_and_a_run_still_does(tmp_path: Path) -> None:
    """A publishing command's --help prints help where its signing key cannot be read; running
    it (even with a workload that takes its own --help, after ``--``) still stops on the key."""
    env = {**os.environ, "NEFFCACHE_SIGNING_KEY": str(tmp_path / "missing-key"), "NEFFCACHE_CONFIG": ""}
    base = [sys.executable, "-m", "neffcache.cli.main"]
    for command in (["warm", "--help"], ["push", "-h"], ["plan", "--help"]):
        done = subprocess.run([*base, *command], capture_output=True, text=True, env=env, check=False)
        assert done.returncode == 0 and "Usage: " in done.stdout, (command, done.stderr)
    run = [*base, "warm", "--instance", "trn2.48xlarge", "--store", str(tmp_path / "s"), "--", "true", "--help"]
    done = subprocess.run(run, capture_output=True, text=True, env=env, check=False)
    assert done.returncode != 0 and "signing key" in done.stderr and "missing-key" in done.stderr
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").rglob("*.neff"))
