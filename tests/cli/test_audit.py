"""``muster log export|import``, ``muster replay``, ``muster explain``, ``muster report`` through CliRunner:
output, and the exit code of every kind of bad input (shared/audit/errors.py)."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders.audit import EPOCH, decision_lines, deployed, exported, lines_of, rewritten, scenario_run
from tests.builders.cli import clean_exit as _clean_exit, flat as _flat, invoke as _invoke
from tests.builders.cli import one_line_error as _error
from tests.builders.shared import SCENARIOS

NAME = "kai-priority-preemption"
REPO = Path(__file__).parents[2]


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return exported(scenario_run(NAME), tmp_path / "log.jsonl")


def test_verify_a_clean_log(log: Path) -> None:
    result = _invoke("replay", log, "--verify")
    _clean_exit(result, 0)
    n = len(scenario_run(NAME).runtime.log)
    assert f"OK: {n} events, 76 decisions re-derived: 76 identical, 0 different" in _flat(result.stdout)  # futile retries gone


def test_a_divergence_prints_both_envelopes_the_input_and_the_causes_and_exits_1(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    i = decision_lines(lines)[3]
    lines[i] = lines[i].replace(b'"reason":"', b'"reason":"forged ', 1)
    result = _invoke("replay", rewritten(log, lines, tmp_path / "bad.jsonl"), "--verify")
    _clean_exit(result, 1)
    out = _flat(result.stdout)
    assert f"DIVERGED at line {i + 2} (differs)" in out
    assert "recorded " + _flat(lines[i].decode()) in out
    assert "re-derived " + _flat(lines_of(log)[i].decode()) in out
    assert "input line" in out and "causes line" in out and "ingest ObjectChanged" in out
    assert "1 different" in out


@pytest.mark.parametrize("tamper, code, text", [
    ("cut", 3, "was cut short"),
    ("no-end", 3, "no end line"),
    ("garbage", 4, "line 5: not a valid envelope"),
    ("newer-schema", 2, "newer than this muster"),
    ("no-header", 4, "not a muster log"),
])
def test_bad_files_give_one_line_and_their_exit_code(log: Path, tmp_path: Path, tamper: str, code: int,
                                                     text: str) -> None:
    raw = log.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    if tamper == "cut":
        bad.write_bytes(log.read_bytes()[:-30])
    elif tamper == "no-end":
        bad.write_bytes(b"".join(raw[:-1]))
    elif tamper == "garbage":
        lines = lines_of(log)
        lines[3] = b"{not an envelope\n"
        rewritten(log, lines, bad)
    elif tamper == "newer-schema":
        bad.write_bytes(json.dumps({**json.loads(raw[0]), "schema_version": 99}).encode() + b"\n" + b"".join(raw[1:]))
    else:
        bad.write_bytes(b"".join(raw[1:]))
    for command in (["replay", bad, "--verify"], ["explain", "default/train-cluster", "--log", bad],
                    ["report", "--log", bad, "--html", tmp_path / "r.html"]):
        _error(_invoke(*command), code, text)


def _bare(log: Path, out: Path, *, keep_event: bool) -> Path:
    """``log`` with no policy in its header, and (``keep_event`` off) without its ``PolicyApplied``: a log
    of a Kafka deployment before the services wrote the event."""
    raw = log.read_bytes().splitlines(keepends=True)
    lines = [line for line in raw[1:-1] if keep_event or b'"type":"PolicyApplied"' not in line]
    out.write_bytes(json.dumps({**json.loads(raw[0]), "policy": None}).encode() + b"\n" + b"".join(lines)
                    + b'{"muster_log_end":{"events":%d}}\n' % len(lines))
    return out


def test_a_log_without_its_policy_needs_one(log: Path, tmp_path: Path) -> None:
    bare = _bare(log, tmp_path / "bare.jsonl", keep_event=False)
    _error(_invoke("replay", bare, "--verify"), 2, "before it records the policy")
    policy = tmp_path / "policy.yaml"  # the run's: simulate answers to the names its KubeRay gives pods
    policy.write_text("scheduler_names: [muster, kai-scheduler, default-scheduler]\n")
    result = _invoke("replay", bare, "--verify", "--policy", policy)
    _clean_exit(result, 0)
    assert "--policy" in result.stderr and "overrides the policy the log records" in _flat(result.stderr)


def test_the_policy_event_is_enough_without_a_header_policy(log: Path, tmp_path: Path) -> None:
    """The policy comes from the log itself: a header that names none (a Kafka export without --policy)
    still verifies, and what-if runs under the recorded policy."""
    bare = _bare(log, tmp_path / "bare.jsonl", keep_event=True)
    result = _invoke("replay", bare, "--verify")
    _clean_exit(result, 0)
    assert "policy differs" not in result.stdout and not result.stderr.strip()


def test_verify_under_another_policy_says_it_differs_and_blames_the_policy(log: Path, tmp_path: Path) -> None:
    """``--policy`` is the user's request: decisions are compared under it, the fields that differ from the
    recorded policy are named before any comparison, and a divergence is put on the policy, not on the log."""
    other = tmp_path / "strict.yaml"
    other.write_text("queueing: StrictFIFO\nmin_runtime_seconds: 600\n"
                     "scheduler_names: [muster, kai-scheduler, default-scheduler]\n")
    result = _invoke("replay", log, "--verify", "--policy", other)
    _clean_exit(result, 1)
    out = _flat(result.stdout)
    assert "overrides the policy the log records" in _flat(result.stderr)
    assert "policy differs" in out and "min_runtime_seconds: 600.0 != 0.0" in out and "queueing: 'StrictFIFO'" in out
    assert out.index("policy differs") < out.index("DIVERGED")
    assert "why the code or policy differs: this replay decides under --policy" in out
    assert "the log was altered" not in out


def test_a_tampered_log_under_its_own_policy_and_code_is_called_altered(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    i = decision_lines(lines)[3]
    lines[i] = lines[i].replace(b'"reason":"', b'"reason":"forged ', 1)
    out = _flat(_invoke("replay", rewritten(log, lines, tmp_path / "bad.jsonl"), "--verify").stdout)
    assert "why the log was altered: this is the code and the policy the log records" in out


def test_a_log_of_other_code_is_not_called_altered(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    assert b'"type":"PolicyApplied"' in lines[0]
    lines[0] = re.sub(rb'"code_digest":"[0-9a-f]+"', b'"code_digest":"0000000000000000"', lines[0])
    lines[0] = lines[0].replace(b'"muster_version":"', b'"muster_version":"0.0.1-old', 1)
    i = decision_lines(lines)[3]
    lines[i] = lines[i].replace(b'"reason":"', b'"reason":"changed ', 1)
    result = _invoke("replay", rewritten(log, lines, tmp_path / "other.jsonl"), "--verify")
    _clean_exit(result, 1)
    out = _flat(result.stdout)
    assert "why the code or policy differs: the log was made by muster 0.0.1-old" in out
    assert "(code 0000000000000000)" in out and "the log was altered" not in out


def test_export_windows_and_compresses(log: Path, tmp_path: Path) -> None:
    out = tmp_path / "w.jsonl.gz"
    result = _invoke("log", "export", "--from", log, "--since", 30, "--out", out)
    _clean_exit(result, 0)
    assert result.stdout.startswith("wrote ") and out.exists()
    _error(_invoke("replay", out, "--verify"), 2, "window of a history")
    _clean_exit(_invoke("explain", "default/train-cluster", "--log", out), 0)


def test_explain_and_report_on_a_window_say_so_first_and_never_contradict_the_recorded_reason(
        tmp_path: Path) -> None:
    """``log export --since 5``: the window lost kuberay-test-queue's definition (0s) and test-cluster-0's
    admission. explain (a workload, a queue) and report say first that the figures count only the window;
    the quota line names the definition as before the window instead of "(not defined) ... unlimited: fits"."""
    whole = exported(scenario_run("volcano-gang-queue"), tmp_path / "whole.jsonl")
    window = tmp_path / "w.jsonl"
    _clean_exit(_invoke("log", "export", "--from", whole, "--since", 5, "--out", window), 0)
    note = ("this log is a window from 5s: state before it is unknown; figures below count only what the window "
            "holds")
    result = _invoke("explain", "default/test-cluster-1", "--log", window, "--at", 60)
    _clean_exit(result, 0)
    out = _flat(result.stdout)
    assert out.startswith(note + " default/test-cluster-1 (RayCluster, queue kuberay-test-queue, priority 0) at 60s")
    assert "why: 3/3 tasks in gang unschedulable" in out and "capability cpu 4: used 3, requested 3" in out
    assert "quota: queue kuberay-test-queue's definition is before the window (if it has one): its limits are " \
           "unknown" in out
    assert "unlimited" not in out and "(not defined)" not in out and "fits" not in out
    doc = json.loads(_invoke("explain", "default/test-cluster-1", "--log", window, "--at", 60, "--json").stdout)
    assert doc["window"] == {"since": 5.0, "until": None} and doc["lines"][0] == note
    queue = _invoke("explain", "--queue", "kuberay-test-queue", "--log", window, "--at", 60)
    _clean_exit(queue, 0)
    assert _flat(queue.stdout).startswith(note + " queue kuberay-test-queue at 60s: 1 waiting")
    listed = json.loads(_invoke("explain", "--queue", "kuberay-test-queue", "--log", window, "--json").stdout)
    assert listed["window"] == {"since": 5.0, "until": None}
    full = json.loads(_invoke("explain", "--queue", "kuberay-test-queue", "--log", whole, "--json").stdout)
    assert full["window"] is None
    later = tmp_path / "later.jsonl"
    _clean_exit(_invoke("log", "export", "--from", whole, "--since", 11, "--out", later), 0)
    gone = _invoke("explain", "default/test-cluster-1", "--log", later, "--at", 60)
    _clean_exit(gone, 1)
    assert "no workload default/test-cluster-1 in the log up to 60s (the log is a window from 11s)" in _flat(gone.stderr)
    page = tmp_path / "r.html"
    _clean_exit(_invoke("report", "--log", window, "--html", page), 0)
    text = page.read_text()
    assert f'<body><h1>muster report: volcano-gang-queue</h1>\n<p class="note" id="window"><strong>{note}</strong>' \
        in text
    _clean_exit(_invoke("report", "--log", whole, "--html", page), 0)
    assert 'id="window"' not in page.read_text()
    change = tmp_path / "p.yaml"
    change.write_text("min_runtime_seconds: 600\n")
    _error(_invoke("replay", window, "--what-if", change), 2, "window of a history")  # what-if takes no window


def test_import_into_a_store_then_verify_explain_and_report_from_it(log: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    n = len(lines_of(log))
    result = _invoke("log", "import", log, "--store", url)
    _clean_exit(result, 0)
    assert f"{n} events written" in result.stdout
    again = _invoke("log", "import", log, "--store", url)
    _clean_exit(again, 0)
    assert f"0 events written, {n} were there already" in again.stdout
    _clean_exit(_invoke("replay", url, "--verify"), 0)
    explained = _invoke("explain", "default/train-cluster", "--store", url, "--at", 40, "--json")
    _clean_exit(explained, 0)
    assert json.loads(explained.stdout)["preempted"][0]["by"] == "default/build-cluster"
    exported_again = tmp_path / "again.jsonl"
    _clean_exit(_invoke("log", "export", "--store", url, "--out", exported_again), 0)
    assert exported_again.read_bytes() == log.read_bytes()
    other = exported(scenario_run("volcano-gang-queue"), tmp_path / "other.jsonl")
    _error(_invoke("log", "import", other, "--store", url), 5, "already holds another history")


def test_explain_a_workload_a_queue_and_an_unknown_one(log: Path) -> None:
    result = _invoke("explain", "default/train-cluster", "--log", log, "--at", 40)
    _clean_exit(result, 0)
    out = _flat(result.stdout)
    assert "Queued for 10s (since 30s)" in out and "preempted at 30s by default/build-cluster" in out
    queue = _invoke("explain", "--queue", "team-a", "--log", log, "--at", 40, "--json")
    _clean_exit(queue, 0)
    assert [p["workload"] for p in json.loads(queue.stdout)["pending"]] == ["default/train-cluster"]
    unknown = _invoke("explain", "default/train", "--log", log)
    _clean_exit(unknown, 1)
    assert "did you mean default/train-cluster" in _flat(unknown.stderr)
    _error(_invoke("explain", "no-slash", "--log", log), 2, "NAMESPACE/NAME")
    _error(_invoke("explain", "--queue", "team-b", "--log", log), 1, "no queue team-b in the log; did you mean team-a?")
    nan = _invoke("explain", "default/train-cluster", "--log", log, "--at", "nan")
    _clean_exit(nan, 2)
    assert "nan is not a number of seconds" in _flat(nan.output)


def test_report_writes_one_page(log: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = _invoke("report", "--log", log, "--html", out)
    _clean_exit(result, 0)
    assert result.stdout.strip() == f"wrote {out}"
    assert 'id="chart-workloads"' in out.read_text()


def test_what_if_prints_the_comparison_and_writes_json_and_html(log: Path, tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("min_runtime_seconds: 600\n")
    doc, page = tmp_path / "w.json", tmp_path / "w.html"
    result = _invoke("replay", log, "--what-if", policy, "--json", doc, "--html", page)
    _clean_exit(result, 0)
    out = _flat(result.stdout)
    assert "reproduces the log's decisions exactly" in out and "2 of 2 workloads changed" in out
    # build-cluster now waits from 30s until deleted at 200s, never admitted: team-a's max is at least that
    assert "170 -> ≥170" in out and "≥: at least" in out and "build-cluster: waited longer by 170s" in out
    assert json.loads(doc.read_text())["queues"]["new"]["team-a"]["preemptions"] == 0
    assert 'id="chart-whatif-waits"' in page.read_text()
    policy.write_text("queueing: Lottery\n")
    _error(_invoke("replay", log, "--what-if", policy), 2, "queueing")


@pytest.mark.parametrize("cpu", ['"99999999999999999999999999999999999999999"', '"-5"', '"lots"'])
def test_what_if_apply_of_a_queue_admission_refuses_is_one_line_naming_the_file(tmp_path: Path, cpu: str) -> None:
    log = exported(scenario_run("volcano-gang-queue"), tmp_path / "v.jsonl")
    policy, extra = tmp_path / "p.yaml", tmp_path / "bigger.yaml"
    policy.write_text("{}\n")
    extra.write_text("apiVersion: scheduling.volcano.sh/v1beta1\nkind: Queue\nmetadata: {name: kuberay-test-queue}\n"
                     f"spec: {{weight: 1, capability: {{cpu: {cpu}, memory: 6Gi}}}}\n")
    result = _invoke("replay", log, "--what-if", policy, "--apply", extra)
    _error(result, 2, f"--apply {extra}: Queue kuberay-test-queue: spec.capability.cpu: ")
    assert "changed" not in result.stdout


def test_what_if_outputs_that_cannot_be_written_are_one_line_before_the_run(log: Path, tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("min_runtime_seconds: 600\n")
    missing = tmp_path / "no-such-folder"
    _error(_invoke("replay", log, "--what-if", policy, "--html", missing / "w.html"), 2,
           f"cannot write the what-if page {missing / 'w.html'}: folder {missing} does not exist")
    _error(_invoke("replay", log, "--what-if", policy, "--json", tmp_path), 2,
           f"cannot write the what-if comparison {tmp_path}: it is a folder")


def test_replay_needs_something_to_do(log: Path) -> None:
    _error(_invoke("replay", log), 2, "--verify")
    _error(_invoke("replay", "sqlite:////nonexistent/dir/h.db", "--verify"), 2, "no database file")


# --------------------------------------------------------------------------- bad input
BINARY = b"\x89PNG\r\n\x1a\n\xff\xfe\x00binary"


@pytest.mark.parametrize("command", [
    ["replay", "{log}", "--what-if", "{bin}"],
    ["replay", "{log}", "--what-if", "{policy}", "--apply", "{bin}"],
    ["replay", "{log}", "--verify", "--policy", "{bin}"],
    ["explain", "default/train-cluster", "--log", "{log}", "--policy", "{bin}"],
    ["simulate", str(SCENARIOS / f"{NAME}.yaml"), "--policy", "{bin}"],
    ["simulate", "{bin}"],
], ids=["what-if", "apply", "replay-policy", "explain-policy", "simulate-policy", "scenario"])
def test_a_binary_file_given_as_text_is_one_line_and_exit_2(log: Path, tmp_path: Path, command: list[str]) -> None:
    binary, policy = tmp_path / "bin.file", tmp_path / "p.yaml"
    binary.write_bytes(BINARY)
    policy.write_text("min_runtime_seconds: 600\n")
    args = [a.format(log=log, bin=binary, policy=policy) for a in command]
    _error(_invoke(*args), 2, f"{binary}: not UTF-8 text (byte 0x89 at offset 0)")


@pytest.mark.parametrize("field, value, text", [
    ("schema_version", 0, "event schema version 0 is unknown"),
    ("schema_version", -1, "event schema version -1 is unknown"),
    ("muster_log", 0, "log layout 0 is unknown"),
    ("muster_log", -1, "log layout -1 is unknown"),
    ("schema_version", 99, "the log's event schema version 99 is newer than this muster's (1)"),
    ("muster_log", 3, "log layout 3 is newer than this muster's (2)"),
])
def test_a_header_version_this_muster_does_not_know_is_exit_2(log: Path, tmp_path: Path, field: str, value: int,
                                                              text: str) -> None:
    raw = log.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(json.dumps({**json.loads(raw[0]), field: value}).encode() + b"\n" + b"".join(raw[1:]))
    for command in (["replay", bad, "--verify"], ["explain", "default/train-cluster", "--log", bad]):
        result = _invoke(*command)
        _error(result, 2, text)
        assert "or later" not in result.stderr


def test_an_envelope_of_schema_version_0_is_exit_2(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    lines[0] = lines[0].replace(b'"schema_version":1', b'"schema_version":0')
    _error(_invoke("replay", rewritten(log, lines, tmp_path / "old.jsonl"), "--verify"), 2,
           "line 2: event schema version 0 is unknown")


def test_bad_time_flags_are_one_line_and_exit_2(log: Path, tmp_path: Path) -> None:
    explain = ("explain", "default/train-cluster", "--log", log)
    _error(_invoke(*explain, "--at", -5), 2, "Invalid value for '--at': -5 is negative: event time starts at 0")
    _error(_invoke(*explain, "--at", "abc"), 2, "Invalid value for '--at': abc is not a number of seconds")
    _error(_invoke(*explain, "--at", "nan"), 2, "nan is not a number of seconds")
    _error(_invoke("log", "export", "--from", log, "--since", "abc", "--out", tmp_path / "x.jsonl"), 2, "--since")
    _error(_invoke("queues", "--at", "-1"), 2, "--at")
    assert not (tmp_path / "x.jsonl").exists()


def test_every_usage_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    _error(_invoke("replay"), 2, "Missing argument 'LOG'")
    _error(_invoke("explain", "--no-such-flag"), 2, "No such option: --no-such-flag")
    _error(_invoke("no-such-command"), 2, "No such command 'no-such-command'")
    _error(_invoke("log", "export"), 2, "Missing option '--out'")
    helped = _invoke("log")  # a group named alone still shows its help
    assert "export" in helped.output and "error:" not in helped.output


def test_at_takes_a_duration_as_scenarios_do(log: Path) -> None:
    seconds = _invoke("explain", "default/train-cluster", "--log", log, "--at", 40, "--json")
    duration = _invoke("explain", "default/train-cluster", "--log", log, "--at", "40s", "--json")
    _clean_exit(duration, 0)
    assert json.loads(duration.stdout) == json.loads(seconds.stdout)


def test_at_past_the_end_of_the_log_says_so_and_explains_at_its_end(log: Path) -> None:
    end = scenario_run(NAME).scenario.until
    result = _invoke("explain", "default/train-cluster", "--log", log, "--at", "1e9")
    _clean_exit(result, 0)
    assert f"note: --at 1e+09s is past the end of the log ({end:g}s): explained at {end:g}s" in _flat(result.stderr)
    assert f"at {end:g}s: Running" in _flat(result.stdout) and "1e+09" not in result.stdout
    queue = _invoke("explain", "--queue", "team-a", "--log", log, "--at", "1e9", "--json")
    _clean_exit(queue, 0)
    assert json.loads(queue.stdout)["at"] == end


def test_at_mid_history_of_a_log_that_goes_on_is_not_called_past_its_end(log: Path, tmp_path: Path) -> None:
    """A deployment's log has no end (its header no ``until``): an ``--at`` before its last event explains
    at that time and says nothing of an end; one after it says it is past the log's last event."""
    header, *rest = log.read_bytes().splitlines(keepends=True)
    fields = json.loads(header)
    fields["until"], fields["origin"] = None, "kafka"
    live = tmp_path / "live.jsonl"
    live.write_bytes(json.dumps(fields).encode() + b"\n" + b"".join(rest))
    last = max(json.loads(line)["occurred_at"] for line in lines_of(live))
    mid = _invoke("explain", "default/train-cluster", "--log", live, "--at", f"{last / 2:g}")
    _clean_exit(mid, 0)
    assert "past" not in _flat(mid.stderr)
    after = _invoke("explain", "default/train-cluster", "--log", live, "--at", f"{last + 10:g}")
    _clean_exit(after, 0)
    assert f"is past the log's last event ({last:g}s)" in _flat(after.stderr)


def test_an_export_window_the_wrong_way_round_is_exit_2(log: Path, tmp_path: Path) -> None:
    out = tmp_path / "w.jsonl"
    _error(_invoke("log", "export", "--from", log, "--since", 100, "--until", 10, "--out", out), 2,
           "--since 100 is after --until 10")
    assert not out.exists()


def test_an_export_window_that_cuts_nothing_is_the_whole_log(log: Path, tmp_path: Path) -> None:
    out = tmp_path / "w.jsonl"
    _clean_exit(_invoke("log", "export", "--from", log, "--since", 0, "--until", "1e9", "--out", out), 0)
    assert out.read_bytes() == log.read_bytes()
    _clean_exit(_invoke("replay", out, "--verify"), 0)


def _stderr_of(args: list[object], *, terminal: bool) -> tuple[bytes, bytes]:
    """``muster ARGS`` as a process, stdout to a pipe and stderr to a terminal (a pty) or a pipe: (stdout,
    stderr). The variables that make rich take a pipe for a terminal, or the other way round, are unset."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE",
                                                            "NO_COLOR", "COLUMNS")}
    env.update(TERM="xterm-256color", PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "shared.cli.main", *map(str, args)]
    if not terminal:
        done = subprocess.run(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout, done.stderr
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=slave)
        os.close(slave)
        err = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the process closed its end
                break
            if not chunk:
                break
            err += chunk
        out, _ = proc.communicate(timeout=120)
    finally:
        os.close(master)
    assert proc.returncode == 0, err
    return out, err


def _bar(what: str) -> re.Pattern[bytes]:
    """``what``, the log's name (its end when long: a pty is 80 columns), then at least 20 columns of bar (━)."""
    return re.compile(what.encode() + rb" \x1b\[2m(\xe2\x80\xa6)?[^\x1b]*/log\.jsonl\x1b\[0m "
                      rb"\x1b\[[0-9;]*m(\xe2\x94\x81){20}")


def test_the_progress_bar_shows_on_a_terminal_and_nowhere_else(log: Path, tmp_path: Path) -> None:
    """On a terminal the bar draws on stderr (the log's name, the bar) and clears itself when done; with -q,
    or when stderr is not a terminal (a pipe, a script, CI), stderr stays empty and the verdict is on stdout."""
    verify = ["replay", log, "--verify"]
    out, err = _stderr_of(verify, terminal=True)
    assert _bar("verifying").search(err), err
    assert err.endswith(b"\x1b[2K"), err  # transient: the bar's line is cleared, the verdict stands alone
    assert b"0 different" in out and b"\x1b" not in out
    quiet_out, quiet_err = _stderr_of([*verify, "-q"], terminal=True)
    assert quiet_err == b"" and b"0 different" in quiet_out
    piped_out, piped_err = _stderr_of(verify, terminal=False)
    assert piped_err == b"" and b"0 different" in piped_out
    _, exporting = _stderr_of(["log", "export", "--from", log, "--out", tmp_path / "again.jsonl"], terminal=True)
    assert _bar("exporting").search(exporting), exporting
    _, piped = _stderr_of(["log", "export", "--from", log, "--out", tmp_path / "piped.jsonl"], terminal=False)
    assert piped == b""


# --------------------------------------------------------------------------- a deployment's times
START = "2026-12-06T04:40:00.000Z"  # tests.builders.audit.EPOCH, where deployed() puts time 0


@pytest.fixture
def live(tmp_path: Path) -> Path:
    """The scenario's log as a deployment's: origin kafka, event times on the wall clock."""
    return deployed(scenario_run(NAME), tmp_path / "live.jsonl")


def test_a_deployments_log_reads_in_iso_8601_and_a_simulated_ones_in_seconds(log: Path, live: Path) -> None:
    deployment = _invoke("explain", "default/train-cluster", "--log", live, "--at", "+40s")
    _clean_exit(deployment, 0)
    out = _flat(deployment.stdout)
    assert "at 2026-12-06T04:40:40.000Z: Queued for 10s (since 2026-12-06T04:40:30.000Z)" in out
    assert "preempted at 2026-12-06T04:40:30.000Z by default/build-cluster" in out and "e+09" not in out
    simulated = _invoke("explain", "default/train-cluster", "--log", log, "--at", "+40s")
    _clean_exit(simulated, 0)
    assert "at 40s: Queued for 10s (since 30s)" in _flat(simulated.stdout)  # as it always read
    queue = _invoke("explain", "--queue", "team-a", "--log", live, "--at", "2026-12-06T04:40:40Z")
    _clean_exit(queue, 0)
    assert "queue team-a at 2026-12-06T04:40:40.000Z: 1 waiting" in _flat(queue.stdout)


def test_at_as_iso_as_time_since_the_start_and_as_epoch_seconds_folds_the_same(live: Path) -> None:
    docs = []
    for at in ("2026-12-06T04:40:40Z", "2026-12-06T13:40:40+09:00", "2026-12-06T04:40:40", "+40s", "1796532040"):
        result = _invoke("explain", "default/train-cluster", "--log", live, "--at", at, "--json")
        _clean_exit(result, 0)
        docs.append(json.loads(result.stdout))
    assert docs[0]["phase"] == "Queued" and all(doc == docs[0] for doc in docs)


def test_local_shows_the_machines_zone(live: Path, tokyo: None) -> None:
    result = _invoke("explain", "default/train-cluster", "--log", live, "--at", "2026-12-06T13:40:40", "--local")
    _clean_exit(result, 0)  # a naive --at is the machine's zone too
    assert "at 2026-12-06T13:40:40.000+09:00: Queued for 10s (since 2026-12-06T13:40:30.000+09:00)" in \
        _flat(result.stdout)


def test_a_time_the_log_cannot_place_is_one_line_and_exit_2(log: Path, live: Path) -> None:
    _error(_invoke("explain", "default/train-cluster", "--log", log, "--at", "2026-12-06T04:40:40Z"), 2,
           "this log is a simulated run, its times are scenario seconds")
    _error(_invoke("explain", "default/train-cluster", "--log", live, "--at", "40"), 2,
           f"this log's times are wall-clock (it starts at {START}): write +40s")
    _error(_invoke("explain", "default/train-cluster", "--log", live, "--at", "2026-02-30T00:00:00Z"), 2,
           "not an ISO 8601 time")
    _error(_invoke("explain", "default/train-cluster", "--log", live, "--at", "+soon"), 2,
           "not a duration after the log's start")


def test_past_the_end_of_a_deployments_log_is_said_in_its_own_times(live: Path) -> None:
    mid = _invoke("explain", "default/train-cluster", "--log", live, "--at", "+100s")
    _clean_exit(mid, 0)
    assert "past" not in _flat(mid.stderr)
    after = _invoke("explain", "default/train-cluster", "--log", live, "--at", "2026-12-07T00:00:00Z")
    _clean_exit(after, 0)
    assert max(json.loads(line)["occurred_at"] for line in lines_of(live)) == EPOCH + 203
    assert ("note: --at 2026-12-07T00:00:00.000Z is past the log's last event (2026-12-06T04:43:23.000Z): "
            "explained as if nothing happened after it") in _flat(after.stderr)


def test_the_store_views_read_a_deployments_times(live: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    _clean_exit(_invoke("log", "import", live, "--store", url), 0)
    history = _invoke("history", "default/train-cluster", "--store", url)
    _clean_exit(history, 0)
    out = _flat(history.stdout)
    assert "2026-12-06T04:40:30.000Z Preempted" in out and "e+09" not in out
    queues = _invoke("queues", "--store", url, "--at", "+40s")
    _clean_exit(queues, 0)
    assert "queues at 2026-12-06T04:40:40.000Z" in _flat(queues.stdout)
    at_iso = _invoke("queues", "--store", url, "--at", "2026-12-06T04:40:40Z", "--json")
    assert json.loads(at_iso.stdout)["at"] == EPOCH + 40


def test_export_windows_a_deployments_log_by_any_time(live: Path, tmp_path: Path) -> None:
    files = []
    for i, since in enumerate(("+40s", "2026-12-06T04:40:40Z", f"{EPOCH + 40:.0f}")):
        result = _invoke("log", "export", "--from", live, "--since", since, "--out", tmp_path / f"w{i}.jsonl")
        _clean_exit(result, 0)
        files.append((tmp_path / f"w{i}.jsonl").read_bytes())
    assert len(set(files)) == 1 and len(lines_of(tmp_path / "w0.jsonl")) < len(lines_of(live))
    explained = _invoke("explain", "--queue", "team-a", "--log", tmp_path / "w0.jsonl")
    assert "this log is a window from 2026-12-06T04:40:40.000Z" in _flat(explained.stdout)


def test_report_and_what_if_of_a_deployment_put_times_on_dates(live: Path, log: Path, tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    _clean_exit(_invoke("report", "--log", live, "--html", page), 0)
    text = page.read_text()
    assert text.count('"xaxis":{"title":{"text":"time (UTC)"},"type":"date"}') == 4 and f"event time\n{START} to" in text
    _clean_exit(_invoke("report", "--log", log, "--html", page), 0)  # a simulated run's page as it was
    assert page.read_text().count('"xaxis":{"title":{"text":"event time (s)"}}') == 4
    assert "event time\n0s to 400s." in page.read_text()
    policy = tmp_path / "p.yaml"
    policy.write_text("min_runtime_seconds: 600\n")
    result = _invoke("replay", live, "--what-if", policy, "--approximate", "--html", tmp_path / "w.html")
    _clean_exit(result, 0)
    assert "per queue, recorded -> new (to 2026-12-06T04:" in _flat(result.stdout)
    assert "both runs to 2026-12-06T04:" in (tmp_path / "w.html").read_text()
