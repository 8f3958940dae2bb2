"""The image (Dockerfile): pinned, hashed dependencies from requirements.lock, non-root, a HEALTHCHECK.

There is no container engine here to build it; what can be checked without one is: the lock pins
every dependency pyproject.toml names, with hashes, and pip resolves it with ``--require-hashes``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"


def locked() -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) from the lock file."""
    out: dict[str, tuple[str, int]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text()):
        match = re.match(r"([A-Za-z0-9._-]+)==([^\s\\]+)", block)
        if match:
            out[match.group(1).lower().replace("_", "-")] = (match.group(2), block.count("--hash=sha256:"))
    return out


def test_the_lock_pins_every_dependency_with_hashes():
    pins = locked()
    assert pins and all(hashes >= 1 for _, hashes in pins.values())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for raw in project["dependencies"]:
        requirement = Requirement(raw)
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not in requirements.lock: run make lock"
        assert requirement.specifier.contains(pins[name][0]), f"{name}=={pins[name][0]} breaks {raw}: run make lock"
    options = [line for line in LOCK.read_text().splitlines() if line.startswith("--")]
    assert options == [], f"machine-specific index options in the lock: {options}"


def test_the_dockerfile_installs_only_the_lock_runs_unprivileged_and_checks_health():
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", text, re.M).group(1)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base
    installs = re.findall(r"pip install[^\n]*", text)
    assert installs == ["pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock"]
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and user[-1].isdigit() and int(user[-1]) > 0
    assert re.search(r"^HEALTHCHECK .*\n?.*/healthz", text, re.M)
    assert "requirements.lock" in (ROOT / ".dockerignore").read_text()  # the context comment names it


def test_the_lock_resolves_with_required_hashes(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--require-hashes",
                             "--no-deps", "--ignore-installed", "--target", str(tmp_path), "-r", str(LOCK)],
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0 and ("No matching distribution" in result.stderr or "connection" in result.stderr.lower()):
        pytest.skip(f"no package index reachable from here: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, result.stderr
