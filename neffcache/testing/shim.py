"""Put the SIMULATED ``neuronx-cc`` on a PATH (never done by default).

neffcache's product code runs whatever ``neuronx-cc`` it finds on PATH, exactly as with the
real Neuron SDK. Tests, the demo and users who want to rehearse a pipeline without the SDK
call :func:`install_compiler_shim` to write a small ``neuronx-cc`` shell script into a
directory of their choosing, and :func:`simulated_env` to get an environment that finds it.

The script exports the chosen settings as defaults: a ``NEFFSIM_*`` variable that the caller
has set (even to the empty string) wins over the baked value, so one shim serves many tests.

Also a CLI: ``python -m neffcache.testing.shim BIN_DIR [--version V] [--compile-seconds S]
[--fail-match RE] [--hang-match RE] [--kill-match RE] [--oom-match RE] [--env-fail LIBRARY]
[--invocation-log FILE]`` prints the installed path.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from neffcache.testing.compiler import DEFAULT_VERSION, UsageError, check_version

SHIM_NAME = "neuronx-cc"


def _shim_script(python: str, settings: Mapping[str, str]) -> str:
    lines = [
        "#!/bin/sh",
        "# neuronx-cc stand-in written by neffcache.testing.shim.",
        "# SIMULATION: this is not the AWS Neuron compiler; it writes fake NEFFs.",
    ]
    for name, value in settings.items():
        # `${X+set}` is empty only when X is unset: a caller's value, even "", wins.
        lines.append(f'[ -z "${{{name}+set}}" ] && {name}={shlex.quote(value)} && export {name}')
    lines.append(f'exec {shlex.quote(python)} -m neffcache.testing.compiler "$@"')
    return "\n".join(lines) + "\n"


def install_compiler_shim(
    bin_dir: Path,
    *,
    version: str = DEFAULT_VERSION,
    compile_seconds: float = 0.0,
    fail_match: str | None = None,
    hang_match: str | None = None,
    invocation_log: Path | None = None,
    python: str = sys.executable,
    kill_match: str | None = None,
    oom_match: str | None = None,
    env_fail: str | None = None,
) -> Path:
    """Write an executable ``bin_dir/neuronx-cc`` running the simulated compiler; return its path.

    ``python`` must be able to import neffcache (the default, the running interpreter, can; a
    ``python`` that does not exist makes a compiler that cannot start, exit 127).
    ``fail_match``, ``hang_match``, ``kill_match``, ``oom_match`` and ``env_fail`` bake the
    faults of :mod:`neffcache.testing.compiler` (``NEFFSIM_*_MATCH``).
    Raises ValueError for a version that could not be a directory name.
    """
    try:
        check_version(version)
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    settings = {"NEFFSIM_COMPILER_VERSION": version, "NEFFSIM_COMPILE_SECONDS": repr(float(compile_seconds))}
    if fail_match is not None:
        settings["NEFFSIM_FAIL_MATCH"] = fail_match
    for name, value in (("NEFFSIM_HANG_MATCH", hang_match), ("NEFFSIM_KILL_MATCH", kill_match),
                        ("NEFFSIM_OOM_MATCH", oom_match), ("NEFFSIM_ENV_FAIL_MATCH", env_fail)):
        if value is not None:
            settings[name] = value
    if invocation_log is not None:
        settings["NEFFSIM_INVOCATION_LOG"] = str(Path(invocation_log).absolute())
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / SHIM_NAME
    tmp = bin_dir / f".{SHIM_NAME}.{os.getpid()}.tmp"
    tmp.write_text(_shim_script(python, settings))
    tmp.chmod(0o755)
    os.replace(tmp, path)  # a concurrent test never runs a half-written script
    return path


def simulated_env(
    bin_dir: Path,
    base: Mapping[str, str] | None = None,
    **overrides: str,
) -> dict[str, str]:
    """A copy of ``base`` (default ``os.environ``) with ``bin_dir`` first on PATH, plus overrides.

    Example: ``simulated_env(bin, NEURON_RT_FAKE_INSTANCE_TYPE="trn2.48xlarge",
    TORCH_NEURONX_COMPILE_ONLY="1")``.
    """
    env = dict(os.environ if base is None else base)
    old_path = env.get("PATH", os.defpath)
    env["PATH"] = os.pathsep.join([str(Path(bin_dir).absolute()), old_path]) if old_path else str(bin_dir)
    env.update(overrides)
    return env


def read_invocation_log(path: Path) -> list[dict[str, object]]:
    """The records ``NEFFSIM_INVOCATION_LOG`` collected (empty if nothing compiled yet)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m neffcache.testing.shim",
        description="Install the SIMULATED neuronx-cc (neffcache.testing) into BIN_DIR.",
    )
    parser.add_argument("bin_dir", type=Path)
    parser.add_argument("--version", default=DEFAULT_VERSION, help="compiler version to report")
    parser.add_argument("--compile-seconds", type=float, default=0.0)
    parser.add_argument("--fail-match", help="regex of graph names that fail to compile")
    parser.add_argument("--hang-match", help="regex of graph names whose compile never ends")
    parser.add_argument("--kill-match", help="regex of graph names whose compile is SIGKILLed (like the OOM killer)")
    parser.add_argument("--oom-match", help="regex of graph names whose compile runs out of memory (MemoryError)")
    parser.add_argument("--env-fail", metavar="LIBRARY", help="every compile fails to load this shared library")
    parser.add_argument("--invocation-log", type=Path, help="append one JSON line per compile here")
    ns = parser.parse_args(argv)
    path = install_compiler_shim(
        ns.bin_dir, version=ns.version, compile_seconds=ns.compile_seconds,
        fail_match=ns.fail_match, hang_match=ns.hang_match, invocation_log=ns.invocation_log,
        kill_match=ns.kill_match, oom_match=ns.oom_match, env_fail=ns.env_fail,
    )
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
