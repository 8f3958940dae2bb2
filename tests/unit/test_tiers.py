"""The Makefile's test tiers (``make unit``, ``make integration``, ``make e2e``) cover every test file
once: a folder of ``test_*.py`` files left out of all three would run in none of them (and in ``make
test`` only by luck), one listed in two would run twice."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIERS = ("UNIT_TESTS", "INTEGRATION_TESTS", "E2E_TESTS")


def tiers() -> dict[str, list[str]]:
    """Each tier variable of the Makefile and the folders it names."""
    found = {}
    for line in (ROOT / "Makefile").read_text().splitlines():
        if (match := re.fullmatch(r"(\w+)\s*:=\s*(.*)", line)) and match[1] in TIERS:
            found[match[1]] = match[2].split()
    return found


def owners(folder: Path, listed: dict[str, list[str]]) -> list[str]:
    """The tier folders ``folder`` is in (itself or a parent of it)."""
    return [path for paths in listed.values() for path in paths
            if folder == ROOT / path or (ROOT / path) in folder.parents]


def test_every_tier_is_defined_and_names_folders_that_exist() -> None:
    listed = tiers()
    assert sorted(listed) == sorted(TIERS)
    for name, paths in listed.items():
        assert paths, name
        for path in paths:
            assert (ROOT / path).is_dir(), f"{name}: {path} is not a folder"


def test_every_folder_of_tests_is_in_exactly_one_tier() -> None:
    listed = tiers()
    folders = sorted({path.parent for path in (ROOT / "tests").rglob("test_*.py")})
    assert folders
    misplaced = {str(folder.relative_to(ROOT)): owners(folder, listed) for folder in folders
                 if len(owners(folder, listed)) != 1}
    assert not misplaced, f"folders in no tier or in several (Makefile's {', '.join(TIERS)}): {misplaced}"


def test_make_test_runs_every_tier() -> None:
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe is not None, "no test target in the Makefile"
    assert "lint" in recipe[0].splitlines()[0], "make test runs the import contracts first"
    for name in TIERS:
        assert f"$({name})" in recipe[1], f"make test leaves out $({name})"


def test_the_real_cluster_folders_are_in_the_e2e_tier() -> None:
    """The parity tier and the comparison with the real peers need the dev cluster (``make tools``)."""
    assert {"tests/realcluster", "tests/peers"} <= set(tiers()["E2E_TESTS"])
