"""Seeing a job (README, "Seeing the job"), checked from outside erun: a job
of examples/train_mlp on three simulated hosts that grows, loses a worker to
SIGKILL and shrinks. Its /metrics page parses as Prometheus text and its
counters move while it recovers; the summary at the end adds up to the wall
time and its goodput is the one this test computes from the event log on its
own; `erun report -o job.html` opens in a headless browser."""
import calendar
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest

from conftest import BUILD, ERUN, pids_running

pytestmark = pytest.mark.skipif(bool(os.environ.get("ERUN_TEST_INSTALLED")),
                                reason="the launcher is the same in the installed pass; the build's pass runs this")

TRAIN_ARGS = ["--samples", "8000", "--epochs", "14", "--batch", "256", "--commit-every", "5", "--step-ms", "40"]


def metrics(port):
    """The /metrics page parsed: {(name, frozenset(labels)): value}."""
    parser = pytest.importorskip("prometheus_client.parser", reason="python3-prometheus-client parses the page")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def independent_goodput(events):
    """Training time over wall time, from the log alone: each stretch from a
    generation_joined to the next reset, survivors_waiting or job_finished,
    less the seconds rolled_back events say were thrown away."""
    start = None
    training, since = 0.0, None
    end = None
    for e in events:
        when = calendar.timegm(time.strptime(e["time"][:19], "%Y-%m-%dT%H:%M:%S")) + int(e["time"][20:23]) / 1000
        if start is None:
            start = when - e["t"]
        if e["event"] == "generation_joined" and since is None:
            since = when
        elif e["event"] in ("reset", "survivors_waiting", "job_finished") and since is not None:
            training += when - since
            since = None
        if e["event"] == "rolled_back":
            training -= e["seconds"]
        if e["event"] == "job_finished":
            end = when
    return training / (end - start), end - start


def test_metrics_summary_and_picture_of_a_job_that_grows_fails_and_shrinks(ws):
    program = ws.path / "train_mlp_view_py"
    shutil.copy(BUILD / "examples" / "train_mlp", program)
    ws.hosts("127.0.0.2:1\n127.0.0.3:1\n")
    disc = ws.path / "discover.sh"
    disc.write_text(f"#!/bin/sh\ncat {ws.path / 'hosts'}\n")
    disc.chmod(0o700)
    job = ws.start([str(ERUN), "--driver-grace", "0", "--event-log", str(ws.path / "events.jsonl"), "--term-grace",
                    "2", "--host-discovery-script", str(disc), "--discovery-interval", "0.2", "--launcher", "local",
                    "-np", "2", "--min-np", "1", "--max-np", "3", "--metrics-port", "0", str(program)] + TRAIN_ARGS)
    assert job.wait_output(r"metrics at http://127\.0\.0\.1:\d+/metrics", 60, stream="err"), job.err
    port = int(re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", job.err).group(1))
    assert job.wait_output(r"epoch 1 ", 120), job.out + job.err

    m = metrics(port)
    assert m[("erun_world_size", frozenset())] == 2
    assert m[("erun_hosts", frozenset())] == 2
    assert m.get(("erun_recovery_seconds_count", frozenset()), 0) == 0

    ws.hosts("127.0.0.2:1\n127.0.0.3:1\n127.0.0.4:1\n")  # grow
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(e["size"] == 3 for e in job.events("generation_started")):
        time.sleep(0.1)
    assert job.wait_events("generation_joined", 2, 120), job.err
    joined = len(job.events("generation_joined"))
    time.sleep(1.5)  # a page after the growth
    assert metrics(port)[("erun_world_size", frozenset())] == 3

    victims = [p for p in pids_running(str(program))
               if open(f"/proc/{p}/cmdline", "rb").read().startswith(str(program).encode() + b"\0")
               and b"\0ERUN_HOSTNAME=127.0.0.3\0" in b"\0" + open(f"/proc/{p}/environ", "rb").read()]
    assert victims, "no worker of 127.0.0.3"
    os.kill(victims[0], signal.SIGKILL)
    assert job.wait_events("generation_joined", joined + 1, 120), job.err
    time.sleep(1.5)
    m = metrics(port)
    assert m[("erun_resets_total", frozenset({("reason", "worker failed")}))] == 1
    assert m[("erun_recovery_seconds_count", frozenset())] >= 2  # the growth and the failure
    assert m[("erun_workers_failed_total", frozenset())] == 1

    ws.hosts("127.0.0.2:1\n127.0.0.3:1\n")  # shrink
    assert job.wait(300) == 0, job.err

    events = [json.loads(line) for line in (ws.path / "events.jsonl").read_text().splitlines()]
    summary = [e for e in events if e["event"] == "job_summary"][-1]
    parts = sum(summary[k] for k in ("startup_s", "training_s", "recovery_s", "rolled_back_s", "waiting_s",
                                     "driver_gap_s"))
    assert abs(parts - summary["wall_s"]) <= 0.01 * summary["wall_s"], summary
    goodput, wall = independent_goodput(events)
    assert abs(goodput - summary["goodput"]) <= 0.01, (goodput, summary)
    assert abs(wall - summary["wall_s"]) <= 0.01 * wall, (wall, summary)
    assert summary["resets"]["worker failed"] == 1 and summary["resets"]["membership changed"] >= 2, summary
    assert f"goodput {100 * summary['goodput']:.1f} %" in job.err

    # The picture, opened by a browser with no network.
    browser = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if browser is None:
        pytest.skip("no headless chromium here (scripts/setup.sh installs chromium-headless-shell)")
    html = ws.path / "job.html"
    r = subprocess.run([str(ERUN), "report", str(ws.path / "events.jsonl"), "-o", str(html)], capture_output=True,
                       text=True, timeout=120)
    if r.returncode == 3:
        pytest.skip(r.stderr)
    assert r.returncode == 0, r.stderr
    shot = ws.path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    f"--user-data-dir={ws.path / 'browser'}", f"--screenshot={shot}", "--window-size=1200,900",
                    html.as_uri()], capture_output=True, timeout=120)
    image = pytest.importorskip("matplotlib.image")
    pixels = image.imread(str(shot))
    assert pixels.shape[0] == 900 and pixels.shape[1] == 1200
    # Not a blank page: the drawing has many colours, the training bar's green among them.
    assert pixels[..., :3].std() > 0.05
    green = ((pixels[..., 1] > 0.5) & (pixels[..., 0] < 0.4) & (pixels[..., 2] < 0.4)).sum()
    assert green > 1000, "no training bar in the screenshot"
