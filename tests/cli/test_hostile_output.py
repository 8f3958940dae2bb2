"""Text from manifests prints as text (issue 33, terminal injection): Rich markup, ANSI escapes, OSC 8 links,
``<a href>`` and ``<script>`` through every field that reaches the terminal (simulate, history, explain) and
the HTML pages (report, what-if)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shared.kernel.display import html_text, plain, printable
from tests.builders import ray_cluster, ray_job
from tests.builders.cli import clean_exit, invoke

REPO = Path(__file__).parents[2]
EVIL = ("[bold red]RED[/] <a href=http://x.example>a</a><script>alert(1)</script> \x1b[31mansi\x1b[0m "
        "\x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\ \x9b31m \u202eright-to-left")
CONTROL = ("\x1b", "\x9b", "\u202e")


def _scenario(path: Path) -> Path:
    """The hostile text as a queue name (an annotation, which no schema bounds), a queue label's near miss
    (a warning) and a RayJob's submissionMode (a rejection's reason)."""
    queued = ray_cluster("c1", annotations={"scheduling.volcano.sh/queue-name": EVIL,
                                            "volcano.sh/queue": EVIL})  # a slip of the queue key: warned of, quoted
    job = ray_job("j1", submission_mode=EVIL)
    doc = {"name": "hostile-text", "cluster": {"nodes": [{"name": "n1", "capacity": {"cpu": "16", "memory": "64Gi",
                                                                                   "pods": "110"}}]},
           "until": "60s", "steps": [{"at": "0s", "apply": yaml.safe_dump_all([queued, job], width=10**9)}]}
    path.write_text(yaml.safe_dump(doc, width=10**9))
    return path


def _no_raw(text: str) -> None:
    for char in CONTROL:
        assert char not in text
    assert "\\x1b[31mansi" in text or "\\x1b" in text  # shown as its escape, not interpreted


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    tmp = tmp_path_factory.mktemp("hostile")
    scenario = _scenario(tmp / "s.yaml")
    store = f"sqlite:///{tmp / 'h.db'}"
    result = invoke("simulate", scenario, "--store", store)
    clean_exit(result, 0)
    log = tmp / "h.jsonl"
    clean_exit(invoke("log", "export", "--store", store, "--out", log), 0)
    return tmp, store, result.stdout


def test_simulate_prints_manifest_text_as_text(run: tuple[Path, str, str]) -> None:
    _, _, out = run
    _no_raw(out)
    assert "[bold red]RED[/]" in out  # the markup as written, not a style
    assert "<script>alert(1)</script>" in out  # a terminal shows tags as text


def test_history_and_explain_print_manifest_text_as_text(run: tuple[Path, str, str]) -> None:
    tmp, store, _ = run
    for args in (("history", "default/c1", "--store", store), ("explain", "default/c1", "--log", tmp / "h.jsonl"),
                 ("explain", "default/j1", "--log", tmp / "h.jsonl")):
        result = invoke(*args)
        clean_exit(result, 0)
        _no_raw(result.stdout)
        assert "[bold red]RED[/]" in result.stdout


def test_the_html_pages_escape_manifest_text(run: tuple[Path, str, str]) -> None:
    tmp, store, _ = run
    report, whatif = tmp / "r.html", tmp / "w.html"
    clean_exit(invoke("report", "--store", store, "--html", report), 0)
    clean_exit(invoke("replay", tmp / "h.jsonl", "--what-if", REPO / "examples/audit/strict.yaml", "--html", whatif), 0)
    for page in (report.read_text(), whatif.read_text()):
        for char in CONTROL:
            assert char not in page
        assert "<script>alert" not in page and "<a href=http://x.example" not in page
        assert "\\u003ca href" not in page.lower() or "&lt;a href" in page  # chart data carries the escaped text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in report.read_text()


def test_one_place_escapes_each_kind_of_output() -> None:
    assert printable("a\x1b[31mb\x07\x9bc\u202ed\te\nf") == "a\\x1b[31mb\\x07\\x9bc\\u202ed\te\nf"
    assert plain("[bold red]x\x1b") == "\\[bold red]x\\x1b"
    assert html_text("<a href='x'>\x1b") == "&lt;a href=&#x27;x&#x27;&gt;\\x1b"
