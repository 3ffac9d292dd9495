"""erun.report, the drawing half of `erun report EVENTS.jsonl -o job.svg|job.html`:
the launcher pipes a job's timeline JSON into `python3 -m erun.report`, which
draws it with matplotlib. The SVG keeps its text, is the same bytes for the
same input and loads nothing; the HTML is one self-contained page; the output
file is written privately and atomically; bad input and a missing matplotlib
get one line and their own exit status."""
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from conftest import SOURCE


REPORT_PY = SOURCE / "python/erun/report.py"
SVG_NS = "{http://www.w3.org/2000/svg}"

# The module's pure parts, loaded alone (importing the erun package needs the
# compiled _erun, which a source tree lacks).
_spec = importlib.util.spec_from_file_location("erun_report", REPORT_PY)
assert _spec is not None and _spec.loader is not None
report = importlib.util.module_from_spec(_spec)
sys.modules["erun_report"] = report  # dataclasses look their module up
_spec.loader.exec_module(report)


def _pythonpath(env):
    """PYTHONPATH as the tests run it (CMake points it at the build's package),
    else the source tree's python/."""
    return env.get("PYTHONPATH") or str(SOURCE / "python")


def _drawing_python():
    """This interpreter when it has matplotlib, else Debian's (the venv pass
    of the tests has no matplotlib; erun report itself falls back to
    /usr/bin/python3 the same way); None when neither has it."""
    for py in (sys.executable, "/usr/bin/python3"):
        if os.access(py, os.X_OK) and subprocess.run([py, "-c", "import matplotlib"], capture_output=True,
                                                     timeout=120).returncode == 0:
            return py
    return None


DRAWING_PYTHON = _drawing_python()


@functools.lru_cache(maxsize=None)
def _command(python):
    """`python -m erun.report` where the erun package imports (the build's or
    an installed one, with _erun); else the source file run as __main__."""
    env = dict(os.environ, PYTHONPATH=_pythonpath(os.environ))
    probe = subprocess.run([python, "-c", "import erun.report"], env=env, capture_output=True, timeout=120)
    if probe.returncode == 0:
        return [python, "-m", "erun.report"]
    # runpy rather than `python report.py`: that would put python/erun first
    # on sys.path, where erun/torch.py stands in for torch.
    return [python, "-c", "import runpy, sys; sys.argv[0] = 'erun.report'; "
                          f"runpy.run_path({str(REPORT_PY)!r}, run_name='__main__')"]


def run_report(args, stdin, env=None, timeout=120, python=None):
    if python is None and DRAWING_PYTHON is None:
        pytest.skip("erun.report draws with matplotlib, which no python here has "
                    "(apt-get install python3-matplotlib, or pip install matplotlib)")
    e = dict(os.environ, PYTHONPATH=_pythonpath(os.environ), PYTHONDONTWRITEBYTECODE="1")
    e.update(env or {})
    data = stdin if isinstance(stdin, bytes) else json.dumps(stdin).encode()
    return subprocess.run(_command(python or DRAWING_PYTHON) + list(args), input=data, capture_output=True, env=e,
                          timeout=timeout)


FAILURE_LABELS = ["node-b rank 3 exited 137", "node-c rank 5 lost (heartbeat)"]


def timeline(**changes):
    doc = {
        "job_id": "erun-5435664e2344",
        "wall_s": 43.0,
        "goodput": 0.931,
        "summary_text": "job erun-5435664e2344: 43.0 s\n  restarts < 3 & <b>not bold</b>\n",
        "world": [[0.0, 0], [0.114, 2], [2.686, 0], [2.767, 4], [4.797, 0], [4.807, 3], [20.0, 0], [20.4, 4],
                  [42.5, 0]],
        "generations": [
            {"generation": 1, "start": 0.016, "end": 2.686, "size": 2, "plan": "2 ranks: node-a[0-1]"},
            {"generation": 2, "start": 2.767, "end": 4.797, "size": 4, "plan": "4 ranks: node-a[0-1] node-b[2-3]"},
            {"generation": 3, "start": 4.807, "end": 20.0, "size": 3, "plan": "3 ranks"},
            {"generation": 4, "start": 20.4, "end": 42.5, "size": 4, "plan": "4 ranks"},
        ],
        "phases": [
            {"start": 0.0, "end": 0.114, "kind": "startup"}, {"start": 0.114, "end": 2.686, "kind": "training"},
            {"start": 2.686, "end": 2.767, "kind": "recovery"}, {"start": 2.767, "end": 4.797, "kind": "training"},
            {"start": 4.797, "end": 4.807, "kind": "recovery"}, {"start": 4.807, "end": 20.0, "kind": "training"},
            {"start": 20.0, "end": 20.4, "kind": "rolled_back"}, {"start": 20.4, "end": 42.5, "kind": "training"},
            {"start": 42.5, "end": 43.0, "kind": "finishing"}, {"start": 30.0, "end": 30.2, "kind": "mystery_kind"},
        ],
        "events": [
            {"t": 2.686, "kind": "membership", "label": "+node-b"},
            {"t": 4.797, "kind": "failure", "label": FAILURE_LABELS[0], "recovery_s": 0.010},
            {"t": 12.0, "kind": "straggler", "label": "node-a rank 1 slow"},
            {"t": 20.0, "kind": "failure", "label": FAILURE_LABELS[1], "recovery_s": 0.4},
            {"t": 41.0, "kind": "takeover", "label": "driver moved to node-b"},
        ],
    }
    doc.update(changes)
    return doc


def draw(tmp_path, doc, name="job.svg", args=()):
    out = tmp_path / name
    r = run_report(["-o", str(out), *args], doc)
    assert r.returncode == 0, r.stderr.decode()
    return out


def texts(svg_path):
    root = ET.parse(svg_path).getroot()
    return root, ["".join(t.itertext()) for t in root.iter(SVG_NS + "text")]


def test_svg_keeps_its_text_marks_every_failure_and_loads_nothing(tmp_path):
    out = draw(tmp_path, timeline())
    root, words = texts(out)  # parses as XML
    title = "erun job erun-5435664e2344 \u2014 goodput 93.1 % of 43.0 s"
    assert title in words and root.find(SVG_NS + "title").text == title
    for label in FAILURE_LABELS:
        assert any(label in w for w in words), label
    assert any("recovered in 10 ms" in w for w in words) and any("recovered in 400 ms" in w for w in words)
    assert {"g1", "g2", "g3", "g4"} <= set(words)
    assert "time since job start (s)" in words
    groups = {g.get("id"): g for g in root.iter(SVG_NS + "g") if g.get("id", "").startswith("events-")}
    assert len(list(groups["events-failure"].iter(SVG_NS + "use"))) == 2  # a marker per failure
    assert {"events-membership", "events-straggler", "events-takeover"} <= set(groups)
    # The legend adds up each kind of time, the unknown kind under its own name.
    assert any(w.startswith("recovery 91") for w in words) and any(w.startswith("mystery_kind") for w in words)
    text = out.read_text()
    urls = set(re.findall(r"https?://[^\"'\s<>]*", text))
    namespaces = set(re.findall(r"xmlns(?::\w+)?=\"(https?://[^\"]*)\"", text))
    assert urls == namespaces, urls - namespaces
    assert "<image" not in text and "<!DOCTYPE" not in text


def test_the_same_input_draws_the_same_bytes(tmp_path):
    a = draw(tmp_path, timeline(), "a.svg").read_bytes()
    b = draw(tmp_path, timeline(), "b.svg").read_bytes()
    assert a == b


def test_html_is_one_page_with_the_svg_inline_and_the_summary_escaped(tmp_path):
    out = draw(tmp_path, timeline(), "job.html")
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<?xml" not in page
    assert "<h1>erun job erun-5435664e2344 \u2014 goodput 93.1 % of 43.0 s</h1>" in page
    assert "restarts &lt; 3 &amp; &lt;b&gt;not bold&lt;/b&gt;" in page and "<b>not bold" not in page
    pre = re.search(r"<pre>(.*)</pre>", page, re.S)
    assert pre and pre.group(1).startswith("job erun-5435664e2344: 43.0 s")
    lower = page.lower()
    for banned in ("<script", "src=\"http", "href=\"http", "@import", "url(http", "url('http", "url(\"http",
                   "<link", "<iframe", "<img"):
        assert banned not in lower, banned
    assert FAILURE_LABELS[0] in page


def test_the_format_comes_from_the_suffix_or_format(tmp_path):
    page = draw(tmp_path, timeline(), "job.HTM")
    assert page.read_text().startswith("<!DOCTYPE html>")
    svg = draw(tmp_path, timeline(), "job.txt", ["--format", "svg"])
    ET.parse(svg)
    out = tmp_path / "job.png"
    r = run_report(["-o", str(out)], timeline())
    err = r.stderr.decode()
    assert r.returncode == 2 and err.startswith("erun report: ") and str(out) in err and err.count("\n") == 1, err
    assert not out.exists()
    r = run_report(["-o", str(tmp_path / "x.svg"), "--format", "png"], timeline())
    assert r.returncode == 2 and r.stderr.decode().startswith("erun report: ")


@pytest.mark.parametrize("stdin, words", [
    (b"{not json", "not JSON"),
    (b"", "no timeline"),
    (b"[1, 2]", "not an object"),
    (json.dumps({k: v for k, v in timeline().items() if k != "wall_s"}).encode(), "wall_s"),
    (json.dumps({k: v for k, v in timeline().items() if k != "world"}).encode(), "world"),
    (json.dumps(timeline(events=[{"t": "soon", "kind": "failure"}])).encode(), "events[0].t"),
    (json.dumps(timeline(phases=[{"start": 0, "end": 1}])).encode(), "phases[0].kind"),
    (json.dumps(timeline(world=[[0, 1, 2]])).encode(), "world[0]"),
    (b'{"job_id": "j", "wall_s": NaN, "goodput": 1, "world": []}', "wall_s"),
    (json.dumps(timeline(spent=[1.0])).encode(), "spent is not an object"),
    (json.dumps(timeline(spent={"training": "long"})).encode(), "spent.training"),
])
def test_a_bad_timeline_is_one_line_and_status_2(tmp_path, stdin, words):
    out = tmp_path / "job.svg"
    r = run_report(["-o", str(out)], stdin)
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert err.startswith("erun report: ") and err.count("\n") == 1 and words in err, err
    assert not out.exists() and os.listdir(tmp_path) == []


def test_the_output_is_private_and_replaces_a_symlink_without_following_it(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours\n")
    os.chmod(outside, 0o644)
    reports = tmp_path / "reports"
    reports.mkdir()
    target = reports / "job.svg"
    target.symlink_to(outside)
    draw(reports, timeline())
    assert not target.is_symlink() and target.is_file()
    assert (target.stat().st_mode & 0o777) == 0o600
    assert outside.read_text() == "not yours\n" and (outside.stat().st_mode & 0o777) == 0o644
    ET.parse(target)
    # An existing file is replaced the same way, and no temp file stays behind.
    target.write_text("old")
    os.chmod(target, 0o644)
    draw(reports, timeline())
    assert (target.stat().st_mode & 0o777) == 0o600 and target.read_text().startswith("<?xml")
    assert os.listdir(reports) == ["job.svg"]


def test_an_unwritable_output_is_status_1(tmp_path):
    out = tmp_path / "missing-dir" / "job.svg"
    r = run_report(["-o", str(out)], timeline())
    assert r.returncode == 1 and r.stderr.decode().startswith(f"erun report: cannot write {out}"), r.stderr


def test_without_matplotlib_status_3_says_what_to_install(tmp_path):
    # A matplotlib that fails to import, ahead of the real one on the path.
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    out = tmp_path / "job.svg"
    r = run_report(["-o", str(out)], timeline(),
                   env={"PYTHONPATH": f"{shim.parent}{os.pathsep}{_pythonpath(os.environ)}"}, python=sys.executable)
    assert r.returncode == 3, r.stderr
    assert r.stderr.decode() == report.NO_MATPLOTLIB + "\n"
    assert not out.exists()


def test_events_outside_the_job_are_drawn_at_its_edges(tmp_path):
    doc = timeline(events=[{"t": -0.5, "kind": "preflight"}, {"t": 44.0, "kind": "failure", "label": "late"},
                           {"t": 1.0, "kind": "odd kind/<x>", "label": "odd"}])
    root, words = texts(draw(tmp_path, doc))
    assert {"preflight", "late", "odd"} <= {w.strip() for w in words}
    ids = {g.get("id") for g in root.iter(SVG_NS + "g")}
    assert {"events-preflight", "events-failure", "events-odd_kind__x_"} <= ids


def test_only_the_required_keys_and_nothing_in_them(tmp_path):
    for doc in ({"job_id": "erun-empty", "wall_s": 10.0, "goodput": 0.0, "world": []},
                {"job_id": "erun-zero", "wall_s": 0, "goodput": 0, "world": [], "generations": [], "phases": [],
                 "events": [], "summary_text": ""}):
        out = draw(tmp_path, doc, doc["job_id"] + ".svg")
        _, words = texts(out)
        assert "no world-size data" in words and "no phase data" in words
        page = draw(tmp_path, doc, doc["job_id"] + ".html").read_text()
        assert "<svg" in page and "<pre>" not in page


def test_a_days_long_job_with_thousands_of_generations_and_events(tmp_path):
    wall = 3 * 86400.0
    n = 2000
    step = wall / n
    generations, phases, world = [], [], [[0.0, 0]]
    for g in range(n):
        start, end = g * step + 20, (g + 1) * step
        generations.append({"generation": g + 1, "start": start, "end": end, "size": 8 + g % 57, "plan": "x"})
        world += [[start, 8 + g % 57], [end, 0]]
        phases += [{"start": start - 20, "end": start, "kind": ("recovery", "waiting", "driver_gap")[g % 3]},
                   {"start": start, "end": end, "kind": "training"}]
    kinds = ["failure", "drain", "straggler", "restore", "membership", "blacklist", "takeover", "preflight"]
    events = [{"t": (i * 7919) % int(wall), "kind": kinds[i % 8], "label": f"node-{i % 97} event {i}",
               **({"recovery_s": 0.5} if kinds[i % 8] == "failure" else {})} for i in range(1000)]
    doc = timeline(wall_s=wall, goodput=0.99, world=world, generations=generations, phases=phases, events=events)
    started = time.monotonic()
    out = draw(tmp_path, doc)
    took = time.monotonic() - started
    assert took < 20, took
    assert out.stat().st_size < 5 * 1024 * 1024, out.stat().st_size
    root, words = texts(out)
    assert "time since job start (h)" in words and "2000 generations" in words and "g1" not in words
    assert "erun job erun-5435664e2344 \u2014 goodput 99.0 % of 3.0 d" in words
    # Every failure has its marker; only some events have room for a label.
    groups = {g.get("id"): g for g in root.iter(SVG_NS + "g") if g.get("id", "").startswith("events-")}
    assert len(list(groups["events-failure"].iter(SVG_NS + "use"))) == 125
    labelled = [int(m.group(1)) for m in (re.search(r"node-\d+ event (\d+)", w) for w in words) if m]
    assert 0 < len(labelled) < 60 and f"events (1000, {len(labelled)} labelled)" in words
    assert {events[i]["kind"] for i in labelled} <= {"failure", "drain", "takeover"}  # when many, only these


# The timeline of a real demo job (43 s, 5 generations, a failure, two host
# changes), as the launcher wrote it: generations 1-4 end at a clock's time
# rather than the job's (they are drawn ending by the next one's start), and
# the 91 ms of rolled-back steps are in "spent" only, with no interval.
DEMO = {
    "job_id": "erun-7b640df0efff", "wall_s": 42.948999881744385, "goodput": 0.9919915074835101,
    "events": [{"kind": "membership", "label": "+node-b", "t": 2.55899977684021},
               {"kind": "failure", "label": "node-b rank 3 exited 137", "recovery_s": 0.012999773025512695,
                "t": 4.819000005722046},
               {"kind": "membership", "label": "-node-a", "t": 7.159999847412109}],
    "generations": [
        {"end": 1795877669.72, "generation": 1, "plan": "2 ranks: node-a[0-1]", "size": 2,
         "start": 0.009999990463256836},
        {"end": 1795877671.882, "generation": 2, "plan": "4 ranks: node-a[0-1] node-b[2-3]", "size": 4,
         "start": 2.6589999198913574},
        {"end": 1795877671.961, "generation": 3, "plan": "3 ranks: node-a[0-1] node-b[2]", "size": 3,
         "start": 4.82099986076355},
        {"end": 1795877674.221, "generation": 4, "plan": "4 ranks: node-a[0-1] node-b[2-3]", "size": 4,
         "start": 4.8999998569488525},
        {"end": 42.948999881744385, "generation": 5, "plan": "2 ranks: node-b[0-1]", "size": 2,
         "start": 7.159999847412109}],
    "phases": [{"end": 0.09099984169006348, "kind": "startup", "start": 0.0},
               {"end": 2.6589999198913574, "kind": "training", "start": 0.09099984169006348},
               {"end": 2.7229998111724854, "kind": "recovery", "start": 2.6589999198913574},
               {"end": 4.819999933242798, "kind": "training", "start": 2.7229998111724854},
               {"end": 4.831999778747559, "kind": "recovery", "start": 4.819999933242798},
               {"end": 7.159999847412109, "kind": "training", "start": 4.831999778747559},
               {"end": 7.245999813079834, "kind": "recovery", "start": 7.159999847412109},
               {"end": 42.948999881744385, "kind": "training", "start": 7.245999813079834}],
    "spent": {"driver_gap": 0.0, "recovery": 0.16199970245361328, "rolled_back": 0.0909572,
              "startup": 0.09099984169006348, "training": 42.60504313760071, "waiting": 0.0},
    "world": [[0.0, 0], [0.09099984169006348, 2], [2.6589999198913574, 0], [2.7229998111724854, 4],
              [4.819999933242798, 0], [4.831999778747559, 3], [5.050999879837036, 4], [7.159999847412109, 0],
              [7.245999813079834, 2], [42.948999881744385, 0]],
}
DEMO_LOST = "lost 0.34 s: start-up 91 ms, recoveries 162 ms, rolled-back steps 91 ms"


def test_the_legend_and_title_count_the_time_spent_rolled_back_steps_included(tmp_path):
    root, words = texts(draw(tmp_path, DEMO))
    title = "erun job erun-7b640df0efff \u2014 goodput 99.2 % of 42.9 s"
    assert title in words and root.find(SVG_NS + "title").text == title
    assert DEMO_LOST in words
    # The totals are "spent"'s: training without its rolled-back steps, and
    # those steps though no interval has their kind; kinds of no time left out.
    legend = [w for w in words if re.match(r"(training|start-up|recovery|rolled-back steps|waiting|driver gap) ", w)]
    assert legend == ["training 42.6 s (99.2 %)", "start-up 91 ms (0.2 %)", "recovery 162 ms (0.4 %)",
                      "rolled-back steps 91 ms (0.2 %)"], legend
    ids = {g.get("id") for g in root.iter(SVG_NS + "g")}
    assert "phases-training" in ids and "phases-rolled_back" not in ids
    assert {"time by phase", "events", "failure \u00d71", "membership \u00d72"} <= set(words)


def test_every_generation_band_wide_enough_has_its_label(tmp_path):
    _, words = texts(draw(tmp_path, DEMO))
    # Generation 3 lasted 79 ms of the 43 s: too narrow for its label.
    assert {"g1", "g2", "g4", "g5"} <= set(words) and "g3" not in words
    wide = dict(DEMO, generations=[dict(g, end=e) for g, e in
                                   zip(DEMO["generations"], (2.66, 4.8, 12.0, 20.0, 42.9))])
    wide["generations"][2]["start"], wide["generations"][3]["start"] = 4.82, 12.0
    _, words = texts(draw(tmp_path, wide, "wide.svg"))
    assert {"g1", "g2", "g3", "g4", "g5"} <= set(words)


def test_without_spent_the_totals_add_up_the_phases():
    tl = report.parse_timeline(timeline())
    assert tl.spent == {}
    totals = report.phase_totals(tl)
    assert round(totals["recovery"], 3) == 0.091 and round(totals["rolled_back"], 3) == 0.4
    assert round(totals["mystery_kind"], 3) == 0.2
    assert report.lost_text(tl) == "lost 0.60 s: start-up 114 ms, recoveries 91 ms, rolled-back steps 400 ms"
    # "spent" wins for its kinds; a kind only the phases know is still added up.
    tl = report.parse_timeline(timeline(spent={"training": 40.0, "startup": 0.1, "recovery": 0.0,
                                               "rolled_back": 2.0, "waiting": 0.0, "driver_gap": 0.0}))
    totals = report.phase_totals(tl)
    assert totals["recovery"] == 0.0 and totals["rolled_back"] == 2.0 and round(totals["finishing"], 3) == 0.5
    assert report.lost_text(tl) == "lost 2.10 s: start-up 100 ms, rolled-back steps 2.00 s"
    assert report.lost_text(report.parse_timeline(timeline(phases=[], spent={"training": 43.0, "startup": 0.0}))) \
        == "no time lost"
    assert report.lost_text(report.parse_timeline({"job_id": "j", "wall_s": 1, "goodput": 1, "world": []})) == ""
    assert [b[1:] for b in report.generation_bands(report.parse_timeline(DEMO), DEMO["wall_s"])] == \
        [(g["start"], e) for g, e in zip(DEMO["generations"], [2.6589999198913574, 4.82099986076355,
                                                                4.8999998569488525, 7.159999847412109,
                                                                42.948999881744385])]


def test_the_legends_sit_in_one_row_under_the_axis_label():
    """Laid out compactly: the legends side by side under the x axis's label,
    inside the figure, not overlapping, and no tall blank below them."""
    matplotlib = pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    for doc, rows in ((DEMO, 1), (timeline(), 2)):
        with matplotlib.rc_context({"font.size": 9}):
            fig = report.draw(report.parse_timeline(doc))
            canvas = FigureCanvasAgg(fig)
            canvas.draw()
            renderer = canvas.get_renderer()
            phases, events = [leg.get_window_extent(renderer) for leg in fig.legends]
            strip = fig.axes[1]
            xlabel = strip.xaxis.label.get_window_extent(renderer)
            figure = fig.bbox
        per_row = report.LEGEND_ROW_H * fig.dpi
        assert phases.x1 < events.x0 and phases.x0 < xlabel.x0 < events.x0  # phases left, events right
        for leg in (phases, events):
            assert figure.x0 <= leg.x0 and leg.x1 <= figure.x1 and leg.y0 >= figure.y0
            assert xlabel.y0 - per_row < leg.y1 < xlabel.y0  # just under the axis label
            assert leg.y0 - figure.y0 < 0.3 * fig.dpi  # no blank band below
            assert abs(leg.height - (report.LEGEND_BASE_H + rows * report.LEGEND_ROW_H) * fig.dpi) < 0.5 * per_row
        labels = [t for t in fig.axes[0].texts if re.fullmatch(r"g\d+", t.get_text())]
        assert labels and all(t.get_window_extent(renderer).y1 <= fig.axes[0].bbox.y1 + 1 for t in labels)


def test_time_units_and_durations():
    assert [report.time_unit(s)[0] for s in (10, 300, 301, 5 * 3600, 3 * 86400, 30 * 86400)] == \
        ["s", "s", "min", "min", "h", "d"]
    assert [report.duration_text(s) for s in (0.0004, 0.010, 2.345, 43.0, 600, 3 * 3600, 3 * 86400)] == \
        ["0.4 ms", "10 ms", "2.35 s", "43.0 s", "10.0 min", "3.0 h", "3.0 d"]


def test_labels_get_rows_without_overlapping():
    xs = [0.1, 0.11, 0.12, 0.13, 0.5, 0.95]
    widths = [0.2] * 6
    places = report.place_labels(xs, widths, [False, False, False, True, False, False], rows=3)
    assert places[3] == (0, False)  # priority first
    spans = {}
    for x, w, p in zip(xs, widths, places):
        if p is not None:
            row, right = p
            spans.setdefault(row, []).append((x - w, x) if right else (x, x + w))
    for row in spans.values():
        row.sort()
        assert all(a[1] <= b[0] for a, b in zip(row, row[1:])), row
    assert places[5] is not None and places[5][1]  # at the right edge: ends at its line
    assert sum(p is None for p in places) >= 1  # four labels in three rows around 0.1


EVENTS = [
    ("00.000", 0.0, "job_started", '"job_id":"erun-7","hosts":"a:1,b:1","min_np":1,"max_np":2'),
    ("00.000", 0.0, "generation_started", '"generation":1,"size":2,"plan":"2 ranks"'),
    ("01.000", 1.0, "generation_joined", '"generation":1,"seconds":1.0'),
    ("05.000", 5.0, "worker_exited", '"generation":1,"host":"b","rank":1,"exit_code":137,"stopped_by_erun":false'),
    ("05.000", 5.0, "reset", '"generation":1,"reason":"worker failed","resets":1'),
    ("05.000", 5.0, "generation_started", '"generation":2,"size":1,"plan":"1 rank"'),
    ("05.250", 5.25, "generation_joined", '"generation":2,"seconds":0.25'),
    ("10.000", 10.0, "job_finished", '"exit_code":0,"generation":2,"resets":1,"launched":2'),
]


def test_erun_report_prints_the_summary_and_draws_the_picture(tmp_path):
    """The launcher's own `erun report` (the build's, or the one pip installed
    into the venv: it finds report.py beside itself and a python with
    matplotlib to run it)."""
    from conftest import ERUN
    log = tmp_path / "events.jsonl"
    log.write_text("".join(f'{{"time":"2026-11-28T12:00:{when}Z","t":{t},"event":"{name}",{fields}}}\n'
                           for when, t, name, fields in EVENTS) + "a line that is no event\n")
    r = subprocess.run([str(ERUN), "report", str(log)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("job erun-7 finished with exit code 0 in 10.00 s: goodput 87.5 %"), r.stdout
    assert "start-up 1.00 s, recoveries 0.25 s" in r.stdout
    assert "skipped 1 line" in r.stderr
    if DRAWING_PYTHON is None:
        pytest.skip("no python here has matplotlib")
    out = tmp_path / "job.svg"
    r = subprocess.run([str(ERUN), "report", str(log), "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    _, words = texts(out)
    assert any("goodput 87.5 %" in w for w in words), words
    assert any("b rank 1 exited 137" in w for w in words), words
    assert os.stat(out).st_mode & 0o777 == 0o600
