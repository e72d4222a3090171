"""Both images carry the C listing helper (neffcache/stores/_listdir.c). It is optional to pip: a
build stage without a compiler, or without setup.py (which declares the extension), installs
neffcache without it, and every scan in production then lists at a third of the speed with no
error anywhere. So each image copies setup.py, installs gcc before it builds, and fails its own
build unless ``neffcache --version`` prints the line these tests hold to the real command's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.files import DOCKER, SERVER_DOCKERFILE, WARMER_DOCKERFILE, stages

ACTIVE = "native listing: active"
IMAGES = [SERVER_DOCKERFILE, WARMER_DOCKERFILE]


def _runs(stage: list[tuple[str, str]]) -> list[str]:
    return [rest for word, rest in stage if word == "RUN"]


@pytest.mark.parametrize("dockerfile", IMAGES, ids=lambda p: p.name)
def test_the_stage_that_builds_neffcache_compiles_the_helper(dockerfile: Path) -> None:
    (build,) = [s for s in stages(dockerfile) if ("COPY", "neffcache/ neffcache/") in s]
    copied = " ".join(rest for word, rest in build if word == "COPY")
    assert "setup.py" in copied.split(), "without setup.py the wheel declares no extension"
    runs = _runs(build)
    builds = next(i for i, run in enumerate(runs) if "pip wheel" in run or "pip install" in run)
    assert any("apt-get install" in run and " gcc" in run for run in runs[:builds]), \
        "no compiler installed before neffcache is built"
    assert any(f'--version | grep -x "{ACTIVE}"' in run for run in runs[builds:]), \
        "the build does not fail when the helper is missing"
    ignore = (DOCKER / f"{dockerfile.name}.dockerignore").read_text().splitlines()
    assert "!setup.py" in ignore, "the build context leaves setup.py out"


def test_the_warmer_checks_the_helper_in_the_image_it_ships() -> None:
    """The wheel stage proves the build; the last stage proves the install into the Neuron
    image's own python3 loads it (a wheel for another Python would install and not load)."""
    last = stages(WARMER_DOCKERFILE)[-1]
    assert any(f'--version | grep -x "{ACTIVE}"' in run for run in _runs(last))


def test_the_line_the_images_check_is_what_version_prints() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NEFFCACHE_NATIVE"}
    on = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "--version"], capture_output=True,
                        text=True, env=env, timeout=60, check=True)
    assert ACTIVE in on.stdout.splitlines()
    off = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "--version"], capture_output=True,
                         text=True, env={**env, "NEFFCACHE_NATIVE": "0"}, timeout=60, check=True)
    assert ACTIVE not in off.stdout.splitlines() and "native listing: off (NEFFCACHE_NATIVE=0)" in off.stdout
