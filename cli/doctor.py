"""``neffcache doctor``: one line per check of this host, stores, index and job environment."""

from __future__ import annotations

import sys

import click

from neffcache.application.config import load_settings
from neffcache.application.doctor import DoctorRequest, diagnose
from neffcache.application.findings import Finding, Level

from .errors import DOCTOR_PROBLEMS, DOCTOR_WARNINGS, OK
from .options import endpoint_option, index_options, store_option, store_options
from .output import json_option, render

_MARK = {Level.OK: "ok", Level.WARNING: "warning", Level.PROBLEM: "PROBLEM"}


def _line(finding: Finding) -> str:
    text = f"{_MARK[finding.level]:<8} {finding.check}: {finding.message}"
    return f"{text}\n         fix: {finding.fix}" if finding.fix and finding.level is not Level.OK else text


@click.command("doctor")
@click.option("--instance", metavar="TYPE", help="Instance type the jobs run on, e.g. trn2.48xlarge.")
@click.option("--lnc", type=click.IntRange(1, 2), help="Logical NeuronCore config (default: the instance's).")
@click.option("--compiler", metavar="PATH", help="The neuronx-cc to check (default: the one on PATH).")
@store_option("A store to check (path, fsx://, s3://...); repeatable. Default: NEFFCACHE_STORES.")
@endpoint_option
@index_options
@json_option
def doctor_cmd(instance: str | None, lnc: int | None, compiler: str | None, stores: tuple[str, ...],
               index_url: str | None, token: str | None, as_json: bool) -> None:
    """Check this host as a job would use it, and say how to fix what is wrong.

    Checks: neuronx-cc and its version; the instance type; each store reachable and writable
    (a real test write and delete under .neffcache/doctor/), its filesystem, free space and
    clock skew; the index server, the token's scope and its clock; the cache variables a job
    would run with (a --cache_dir in NEURON_CC_FLAGS overriding NEURON_COMPILE_CACHE_URL,
    directories not versioned by target/LNC, LNC mismatches).

    Exit code: 0 when every check is ok, 10 when the worst finding is a warning, 11 when
    something is a problem.

    \b
    Example:
      neffcache doctor --instance trn2.48xlarge --store fsx:///mnt/fsx/neuron-cache \\
          --store s3://my-bucket/neuron-cache --index-url http://neffcache-index:8787
    """
    settings = load_settings(instance=instance, compiler=compiler, stores=stores or None,
                             index_url=index_url, token=token)
    options = store_options(settings)
    req = DoctorRequest(instance=settings.instance, lnc=lnc, compiler=settings.compiler, stores=settings.stores,
                        index_url=settings.index_url, token=settings.token, store_options=options)
    streamed = not as_json and sys.stdout.isatty()
    report = diagnose(req, on_finding=(lambda f: click.echo(_line(f))) if streamed else None)
    if not streamed:
        render(as_json, report.to_json(), lambda: "\n".join(_line(f) for f in report.findings))
    counts = report.to_json()["counts"]
    if not as_json:
        click.echo(f"{counts['ok']} ok, {counts['warning']} warning(s), {counts['problem']} problem(s)", err=True)
    sys.exit({Level.OK: OK, Level.WARNING: DOCTOR_WARNINGS, Level.PROBLEM: DOCTOR_PROBLEMS}[report.worst])


COMMANDS = [doctor_cmd]
