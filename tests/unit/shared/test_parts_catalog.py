"""Where the catalog finds the parts that are Debian's packages, and what it says when one will not do."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.parts import build, catalog


def fake_prometheus(tmp_path: Path, version: str) -> Path:
    program = tmp_path / "prometheus"
    program.write_text(f"#!/bin/sh\necho 'prometheus, version {version} (branch: debian/sid)'\n")
    program.chmod(0o755)
    return program


def test_every_part_has_a_way_to_be_made() -> None:
    assert set(catalog.PARTS) == set(build.BUILDERS) | set(catalog.DEBIAN)
    assert set(catalog.PARTS) == set(catalog.pins())


def test_debian_parts_are_named_debian_in_the_cache() -> None:
    assert catalog.version("prometheus") == catalog.version("postgresql") == "debian"
    assert catalog.version("jaeger") == catalog.pins()["jaeger"]["version"]


def test_a_prometheus_of_a_pinned_major_is_the_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    program = fake_prometheus(tmp_path, "2.42.0+ds")
    monkeypatch.setenv("MUSTER_PROMETHEUS_BIN", str(program))
    found = catalog.built("prometheus")
    assert (found.version, found.manifest["bin"]) == ("2.42.0+ds", str(program))


def test_a_prometheus_of_another_major_is_refused_saying_which(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_PROMETHEUS_BIN", str(fake_prometheus(tmp_path, "1.8.2")))
    with pytest.raises(catalog.MissingPart, match=r"version 1\.8\.2, not of a pinned major \(2, 3\)") as missing:
        catalog.built("prometheus")
    assert not missing.value.unreachable


def test_no_prometheus_and_no_apt_get_is_out_of_reach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MUSTER_PROMETHEUS_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no prometheus, no apt-get
    with pytest.raises(catalog.MissingPart, match="apt-get") as missing:
        catalog.built("prometheus")
    assert missing.value.unreachable


def test_a_peers_replace_block_is_read_from_its_go_mod(tmp_path: Path) -> None:
    """Volcano's go.mod pins every k8s.io module in a replace block; the wrapper module carries it over."""
    gomod = tmp_path / "go.mod"
    gomod.write_text("module volcano.sh/volcano\n\nrequire k8s.io/api v0.30.2\n\nreplace (\n"
                     "\tk8s.io/api => k8s.io/api v0.30.2 // pinned\n\tgoogle.golang.org/grpc => google.golang.org/grpc v1.57.0\n"
                     "\texample.com/fork => example.com/other v1.0.0\n)\n\nreplace k8s.io/kubectl => k8s.io/kubectl v0.30.2\n")
    assert build.replace_block(gomod) == {"k8s.io/api": "v0.30.2", "google.golang.org/grpc": "v1.57.0",
                                          "k8s.io/kubectl": "v0.30.2"}
