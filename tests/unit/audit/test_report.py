"""shared/audit/report.py: one self-contained HTML page whose charts render in a real browser."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from shared.audit.fold import fold
from shared.audit.report import render, write_report
from tests.builders.audit import scenario_run

NAME = "kai-priority-preemption"
CHARTS = ("chart-workloads", "chart-usage-cpu", "chart-usage-memory", "chart-usage-nvidia-com-gpu", "chart-waits")


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = scenario_run(NAME)
    out = tmp_path_factory.mktemp("report") / "report.html"
    write_report(fold(run.runtime.log, series=True), out, title="report", end=run.scenario.until)
    return out


def test_the_page_holds_every_chart_the_preemptions_and_plotly_itself(page: Path) -> None:
    text = page.read_text()
    for div in CHARTS:
        assert f'id="{div}"' in text
    assert "default/train-cluster" in text and "default/build-cluster" in text
    assert re.search(r'<table id="preemptions">.*priority preemption.*</table>', text, re.S)
    assert "Plotly.newPlot" in text
    assert not re.search(r'<script[^>]+src=', text), "the page must load nothing from the network"


def test_a_history_without_preemptions_says_so() -> None:
    run = scenario_run("volcano-gang-queue")
    text = render(fold(run.runtime.log, series=True), run.scenario.until, title="r")
    assert "no preemptions" in text and 'id="chart-usage-cpu"' in text


def test_a_workload_still_waiting_at_the_end_counts_in_its_queues_waits_as_at_least() -> None:
    run = scenario_run("fair-share-two-teams")  # two workloads still wait at 300s
    text = render(fold(run.runtime.log, series=True), run.scenario.until, title="r")
    row = re.search(r'<table id="queues">.*?<tr><td>\(all\)</td>(.*?)</tr>', text, re.S)
    assert row and "<td>≥120</td>" in row.group(1) and "≥: at least" in text


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


def test_the_charts_render_in_headless_chromium(page: Path, tmp_path: Path) -> None:
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium to render the report in (Debian: apt-get install chromium); the page itself is "
                    "checked above")
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=15000", "--dump-dom",
         page.as_uri()], capture_output=True, timeout=180, check=True).stdout.decode()
    for div in CHARTS:  # plotly marks a div it drew into, and draws an svg in it
        assert re.search(rf'id="{div}" class="[^"]*js-plotly-plot', dom), div
    assert dom.count('class="main-svg"') >= 2 * len(CHARTS)
    assert dom.count('class="trace bars"') >= 2       # the Gantt: a trace per phase drawn
    assert 'class="trace boxes"' in dom                # the admission-wait distribution
    assert dom.count('class="js-line"') >= 3           # a usage line per resource
