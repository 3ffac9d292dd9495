"""Draws a finished job's timeline: the picture of ``erun report EVENTS.jsonl -o job.svg|job.html``.

The launcher works out everything about the job from its event log and pipes
a timeline JSON document into ``python3 -m erun.report [--format svg|html] -o
FILE``; this module only draws it, with matplotlib's Figure API (no pyplot, no
display). The picture: the world size over time on the generations' bands,
with the job's events as marked lines, over a strip of the job's phases whose
legend adds up the time each kind took (the document's ``spent`` totals where
it has them: rolled-back steps have no interval of their own). The title's
second line names the time lost, by kind. SVG keeps its text as text and is the
same bytes for the same input; HTML is one self-contained file: the SVG inline
and the launcher's text summary, nothing loaded from elsewhere.

Needs nothing from erun's compiled extension. Exit status: 0 drawn, 1 the file
could not be written, 2 bad arguments or a bad timeline, 3 no matplotlib.
"""
from __future__ import annotations

import argparse
import contextlib
import html
import io
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, NoReturn, Optional, Sequence, Tuple

if TYPE_CHECKING:
    # Debian 12's matplotlib (3.6) has no type information and the test venv
    # none at all: their names are Any there, checked where matplotlib has types.
    from matplotlib.axes import Axes  # type: ignore[import-untyped, import-not-found, unused-ignore]
    from matplotlib.figure import Figure  # type: ignore[import-untyped, import-not-found, unused-ignore]

NO_MATPLOTLIB = ("erun report: drawing needs matplotlib (apt-get install python3-matplotlib, or pip install "
                 "matplotlib); erun report EVENTS.jsonl without -o prints the summary without it")

FORMATS = {".svg": "svg", ".html": "html", ".htm": "html"}

# Phases: training, then the kinds of lost time in a fixed order (colours and
# legend entries do not move between jobs); a kind this module does not know
# is drawn grey under its own name.
PHASE_COLORS = {
    "training": "#43a047",
    "startup": "#90a4ae",
    "recovery": "#ef6c00",
    "rolled_back": "#c62828",
    "waiting": "#fbc02d",
    "driver_gap": "#8d6e63",
    "finishing": "#cfd8dc",
}
OTHER_PHASE_COLOR = "#9e9e9e"
# Their names in the legend (a kind not here keeps the launcher's name), and
# the kinds of lost time as the launcher's summary names them, in the title.
PHASE_NAMES = {
    "training": "training",
    "startup": "start-up",
    "recovery": "recovery",
    "rolled_back": "rolled-back steps",
    "waiting": "waiting",
    "driver_gap": "driver gap",
    "finishing": "finishing",
}
LOST_NAMES = {
    "startup": "start-up",
    "recovery": "recoveries",
    "rolled_back": "rolled-back steps",
    "waiting": "waiting for --min-np",
    "driver_gap": "driver gap",
}

# Events: (colour, marker) by kind; unknown kinds get the last.
EVENT_STYLES = {
    "failure": ("#d32f2f", "X"),
    "drain": ("#f57c00", "v"),
    "takeover": ("#c2185b", "*"),
    "straggler": ("#7b1fa2", "s"),
    "restore": ("#1976d2", "o"),
    "membership": ("#00897b", "^"),
    "blacklist": ("#212121", "D"),
    "preflight": ("#616161", "P"),
}
OTHER_EVENT_STYLE = ("#9e9e9e", "o")
# With more events than this only these kinds get a text label; the rest show
# as marked lines.
MANY_EVENTS = 25
LABELLED_WHEN_MANY = ("failure", "drain", "takeover")
# More generations than this: bands only, no "gN" labels (a band too narrow
# for its label has none either).
MAX_GENERATION_LABELS = 40
MAX_LABEL_CHARS = 60

# The figure's layout, fixed so that the output depends only on the input:
# widths in fractions of the figure, heights in inches from the top (the
# figure is as tall as what it holds: the legends' rows vary).
FIG_W = 12.0
LEFT, RIGHT = 0.06, 0.985
TOP_PAD = 0.1            # above the title
TITLE_H = 0.3            # the title's line
LOST_H = 0.2             # the lost-time line under it
ABOVE_AXES = 0.2         # room for "N generations" and the top tick label
WORLD_H = 3.2
STRIP_GAP, STRIP_H = 0.13, 0.32
XAXIS_H = 0.48           # the strip's tick labels and the axis label
LEGEND_GAP, BOTTOM_PAD = 0.06, 0.08
TITLE_FONT, LOST_FONT = 13.0, 9.5
LEGEND_FONT = 8.0
# A legend of that font (matplotlib's defaults: handle 2 em, its gap 0.8 em,
# columns 2 em apart, 0.4 em around): inches per row and for the title and
# padding; both legends share one row under the axis label while they fit.
LEGEND_ROW_H, LEGEND_BASE_H = 0.16, 0.2
LEGEND_GAP_BETWEEN = 0.3
LABEL_FONT = 7.0
BAND_LABEL_Y = 0.992                              # generation labels, in axes fractions
MARKER_Y = 0.935                                  # event markers, the same
LABEL_ROWS = (0.885, 0.825, 0.765, 0.705, 0.645)  # event label rows, the same
SVG_SALT = "erun-report"


class BadTimeline(ValueError):
    """The timeline document is not what the launcher writes."""


@dataclass
class Generation:
    number: int
    start: float
    end: float
    size: Optional[float] = None
    plan: str = ""


@dataclass
class Phase:
    start: float
    end: float
    kind: str


@dataclass
class Event:
    t: float
    kind: str
    label: str
    recovery_s: Optional[float] = None


@dataclass
class Timeline:
    job_id: str
    wall_s: float
    goodput: float
    world: List[Tuple[float, float]]
    generations: List[Generation] = field(default_factory=list)
    phases: List[Phase] = field(default_factory=list)
    events: List[Event] = field(default_factory=list)
    summary_text: str = ""
    # Seconds by kind of time (training and each kind lost), as the launcher
    # adds them up; empty when the document has none.
    spent: Dict[str, float] = field(default_factory=dict)


# --- reading the document -------------------------------------------------

def _number(value: object, where: str) -> float:
    # bool is an int to Python, never a time to the launcher.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadTimeline(f"{where} is not a number")
    number = float(value)
    if not math.isfinite(number):
        raise BadTimeline(f"{where} is not a finite number")
    return number


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise BadTimeline(f"{where} is not a string")
    return value


def _require(obj: Mapping[str, object], key: str, where: str) -> object:
    if key not in obj:
        raise BadTimeline(f"missing key {where}{key}")
    return obj[key]


def _list(doc: Mapping[str, object], key: str) -> List[object]:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadTimeline(f"{key} is not a list")
    return value


def _object(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise BadTimeline(f"{where} is not an object")
    return value


def parse_timeline(doc: object) -> Timeline:
    """The Timeline of a decoded JSON document; BadTimeline names the first
    key that is missing or of the wrong type."""
    top = _object(doc, "the timeline")
    job_id = _text(_require(top, "job_id", ""), "job_id")
    wall_s = _number(_require(top, "wall_s", ""), "wall_s")
    if wall_s < 0:
        raise BadTimeline("wall_s is negative")
    goodput = _number(_require(top, "goodput", ""), "goodput")
    world_value = _require(top, "world", "")
    if not isinstance(world_value, list):
        raise BadTimeline("world is not a list")
    world: List[Tuple[float, float]] = []
    for i, point in enumerate(world_value):
        if not isinstance(point, list) or len(point) != 2:
            raise BadTimeline(f"world[{i}] is not a [t, size] pair")
        world.append((_number(point[0], f"world[{i}][0]"), _number(point[1], f"world[{i}][1]")))
    world.sort(key=lambda p: p[0])

    generations = []
    for i, value in enumerate(_list(top, "generations")):
        where = f"generations[{i}]."
        g = _object(value, f"generations[{i}]")
        size = g.get("size")
        generations.append(Generation(
            number=int(_number(g.get("generation", i + 1), where + "generation")),
            start=_number(_require(g, "start", where), where + "start"),
            end=_number(_require(g, "end", where), where + "end"),
            size=None if size is None else _number(size, where + "size"),
            plan=_text(g.get("plan", ""), where + "plan")))
    generations.sort(key=lambda g: g.start)

    phases = []
    for i, value in enumerate(_list(top, "phases")):
        where = f"phases[{i}]."
        p = _object(value, f"phases[{i}]")
        phases.append(Phase(start=_number(_require(p, "start", where), where + "start"),
                            end=_number(_require(p, "end", where), where + "end"),
                            kind=_text(_require(p, "kind", where), where + "kind")))

    events = []
    for i, value in enumerate(_list(top, "events")):
        where = f"events[{i}]."
        e = _object(value, f"events[{i}]")
        kind = _text(_require(e, "kind", where), where + "kind")
        recovery = e.get("recovery_s")
        events.append(Event(t=_number(_require(e, "t", where), where + "t"), kind=kind,
                            label=_text(e.get("label", kind), where + "label"),
                            recovery_s=None if recovery is None else _number(recovery, where + "recovery_s")))
    events.sort(key=lambda e: e.t)

    spent: Dict[str, float] = {}
    spent_value = top.get("spent")
    if spent_value is not None:
        for kind, seconds in _object(spent_value, "spent").items():
            spent[kind] = max(_number(seconds, f"spent.{kind}"), 0.0)

    summary = top.get("summary_text")
    return Timeline(job_id=job_id, wall_s=wall_s, goodput=goodput, world=world, generations=generations,
                    phases=phases, events=events,
                    summary_text="" if summary is None else _text(summary, "summary_text"), spent=spent)


# --- words -----------------------------------------------------------------

def duration_text(seconds: float) -> str:
    """A duration the way a person reads it: 10 ms, 2.35 s, 4.1 min, 3.2 h, 2.5 d."""
    s = max(seconds, 0.0)
    if s < 1:
        ms = s * 1000
        return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"
    if s < 10:
        return f"{s:.2f} s"
    if s < 300:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def title_text(tl: Timeline) -> str:
    wall = f"{tl.wall_s:.1f} s" if tl.wall_s < 300 else duration_text(tl.wall_s)
    return f"erun job {tl.job_id} \u2014 goodput {tl.goodput * 100:.1f} % of {wall}"


def phase_totals(tl: Timeline) -> Dict[str, float]:
    """Seconds by kind of time: the document's ``spent`` where it has a kind
    (rolled-back steps have no interval: they were training thrown away by
    a failure), else the kind's phase intervals added up."""
    totals: Dict[str, float] = {}
    for p in tl.phases:
        if p.kind not in tl.spent:
            totals[p.kind] = totals.get(p.kind, 0.0) + max(p.end - p.start, 0.0)
    totals.update(tl.spent)
    return totals


def _lost_total_text(seconds: float) -> str:
    return f"{seconds:.2f} s" if 0.01 <= seconds < 10 else duration_text(seconds)


def lost_text(tl: Timeline) -> str:
    """The title's second line: the time lost and its non-zero kinds, in the
    launcher's order; "" when the document says nothing about it."""
    totals = phase_totals(tl)
    lost = [(kind, totals[kind]) for kind in LOST_NAMES if kind in totals]
    if not lost:
        return ""
    parts = [f"{LOST_NAMES[kind]} {duration_text(s)}" for kind, s in lost if s > 0]
    if not parts:
        return "no time lost"
    return f"lost {_lost_total_text(sum(s for _, s in lost))}: " + ", ".join(parts)


def time_unit(span_s: float) -> Tuple[str, float]:
    """The x axis's unit for a job this long, and seconds per unit."""
    if span_s <= 300:
        return "s", 1.0
    if span_s <= 5 * 3600:
        return "min", 60.0
    if span_s <= 4 * 86400:
        return "h", 3600.0
    return "d", 86400.0


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_LABEL_CHARS else text[:MAX_LABEL_CHARS - 1] + "\u2026"


def _id_part(kind: str) -> str:
    # Kinds name SVG groups (events-failure, phases-training): keep ids plain.
    return re.sub(r"[^A-Za-z0-9_-]", "_", kind)


def event_label(e: Event) -> str:
    text = _shorten(e.label or e.kind)
    if e.kind == "failure" and e.recovery_s is not None:
        text += f" (recovered in {duration_text(e.recovery_s)})"
    return text


# --- layout ------------------------------------------------------------------

def _text_width(text: str, axes_width_in: float, fontsize: float = LABEL_FONT) -> float:
    # An estimate from the character count (an average glyph of DejaVu Sans is
    # about 0.6 em): no renderer is needed and the layout stays the same
    # wherever it is drawn.
    return (len(text) + 1) * fontsize * 0.6 / 72 / axes_width_in


def _legend_width(labels: Sequence[str], rows: int, title: str, measure: Callable[[str], float]) -> float:
    """A legend's width in inches in that many rows (matplotlib fills its
    columns top to bottom); ``measure`` gives a text's width in inches."""
    em = LEGEND_FONT / 72
    columns = [labels[i:i + rows] for i in range(0, len(labels), rows)]
    width = sum(2.8 * em + max(measure(t) for t in c) for c in columns) + 2 * em * (len(columns) - 1)
    return max(width, measure(title)) + 0.8 * em


def legend_rows(phase_labels: Sequence[str], event_labels: Sequence[str], phase_title: str, event_title: str,
                width_in: float, measure: Callable[[str], float]) -> int:
    """The fewest rows in which both legends fit side by side in width_in."""
    most = max(len(phase_labels), len(event_labels), 1)
    for rows in range(1, most + 1):
        width = LEGEND_GAP_BETWEEN if phase_labels and event_labels else 0.0
        for labels, title in ((phase_labels, phase_title), (event_labels, event_title)):
            if labels:
                width += _legend_width(labels, rows, title, measure)
        if width <= width_in:
            return rows
    return most


def generation_bands(tl: Timeline, span: float) -> List[Tuple[Generation, float, float]]:
    """Each generation's band (start, end) in seconds, kept inside the job: a
    generation ends by the time the next starts, and one with an end past the
    job's (or none that makes sense) ends with the job."""
    bands = []
    for i, g in enumerate(tl.generations):
        end = g.end
        if i + 1 < len(tl.generations):
            end = min(end, tl.generations[i + 1].start)
        start = min(max(g.start, 0.0), span)
        bands.append((g, start, min(max(end, start), span)))
    return bands


def place_labels(xs: Sequence[float], widths: Sequence[float], priority: Sequence[bool],
                 rows: int) -> List[Optional[Tuple[int, bool]]]:
    """Rows for text labels at axes fractions ``xs`` of the given widths, so
    that no two overlap: for each label (row, right_aligned), or None where no
    row has room. Labels with priority get their rows first."""
    taken: List[List[Tuple[float, float]]] = [[] for _ in range(rows)]
    placed: List[Optional[Tuple[int, bool]]] = [None] * len(xs)
    gap = 0.004
    order = [i for i in range(len(xs)) if priority[i]] + [i for i in range(len(xs)) if not priority[i]]
    for i in order:
        right_aligned = xs[i] + widths[i] > 1.0
        lo, hi = (xs[i] - widths[i], xs[i]) if right_aligned else (xs[i], xs[i] + widths[i])
        for row in range(rows):
            if all(hi + gap <= a or lo >= b + gap for a, b in taken[row]):
                taken[row].append((lo, hi))
                placed[i] = (row, right_aligned)
                break
    return placed


# --- drawing -----------------------------------------------------------------

def draw(tl: Timeline) -> "Figure":
    """The job's figure (call inside the rc_context of render_svg)."""
    from matplotlib import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
        collections as mcollections, lines as mlines, patches as mpatches, ticker as mticker)
    from matplotlib.figure import Figure  # type: ignore[import-untyped, import-not-found, unused-ignore]
    from matplotlib.font_manager import FontProperties  # type: ignore[import-untyped, import-not-found, unused-ignore]
    from matplotlib.textpath import TextToPath  # type: ignore[import-untyped, import-not-found, unused-ignore]

    times = [t for t, _ in tl.world] + [p.end for p in tl.phases] + [e.t for e in tl.events] + \
            [g.start for g in tl.generations]
    if tl.generations:
        times.append(tl.generations[-1].end)
    span = tl.wall_s if tl.wall_s > 0 else max(times + [0.0])
    if span <= 0:
        span = 1.0
    unit, per = time_unit(span)
    xmax = span / per

    def at(e: Event) -> float:
        # An event a little outside the job (a clock's rounding) is drawn at its edge.
        return min(max(e.t, 0.0), span)

    # The legends' entries first: their rows decide the figure's height.
    totals = phase_totals(tl)
    bars: Dict[str, List[Tuple[float, float]]] = {}
    for p in tl.phases:
        bars.setdefault(p.kind, []).append((p.start / per, max(p.end - p.start, 0.0) / per))
    shown = [k for k in totals if totals[k] > 0 or k == "training"]
    phase_kinds = [k for k in PHASE_COLORS if k in shown] + sorted(set(shown) - set(PHASE_COLORS))
    phase_labels = []
    for kind in phase_kinds:
        share = f" ({totals[kind] / tl.wall_s * 100:.1f} %)" if tl.wall_s > 0 else ""
        phase_labels.append(f"{PHASE_NAMES.get(kind, kind)} {duration_text(totals[kind])}{share}")
    kinds = [k for k in EVENT_STYLES if any(e.kind == k for e in tl.events)]
    kinds += sorted({e.kind for e in tl.events} - set(EVENT_STYLES))
    event_counts = [sum(e.kind == k for e in tl.events) for k in kinds]
    event_labels = [f"{kind} \u00d7{n}" for kind, n in zip(kinds, event_counts)]

    axes_w = FIG_W * (RIGHT - LEFT)
    candidates = [e for e in tl.events
                  if len(tl.events) <= MANY_EVENTS or e.kind in LABELLED_WHEN_MANY]
    texts = [event_label(e) for e in candidates]
    places = place_labels([at(e) / span for e in candidates], [_text_width(t, axes_w) for t in texts],
                          [e.kind in LABELLED_WHEN_MANY for e in candidates], len(LABEL_ROWS))
    labelled = sum(p is not None for p in places)
    phase_title = "time by phase"
    event_title = "events" if labelled == len(tl.events) else f"events ({len(tl.events)}, {labelled} labelled)"
    # The legends' text measured with their font (its metrics: no renderer
    # is needed, the same wherever it is drawn).
    to_path, legend_font = TextToPath(), FontProperties(size=LEGEND_FONT)

    def measure(text: str) -> float:
        return float(to_path.get_text_width_height_descent(text, legend_font, ismath=False)[0]) / 72

    rows = legend_rows(phase_labels, event_labels, phase_title, event_title, axes_w, measure) \
        if phase_labels or event_labels else 0

    # Heights from the top, in inches, and the figure just as tall.
    lost = lost_text(tl)
    axes_top = TOP_PAD + TITLE_H + (LOST_H if lost else 0.0) + ABOVE_AXES
    strip_top = axes_top + WORLD_H + STRIP_GAP
    legend_top = strip_top + STRIP_H + XAXIS_H + LEGEND_GAP
    height = legend_top + (LEGEND_BASE_H + LEGEND_ROW_H * rows if rows else 0.0) + BOTTOM_PAD

    def y(inches_from_top: float) -> float:
        return 1 - inches_from_top / height

    fig = Figure(figsize=(FIG_W, height))
    ax: Axes = fig.add_axes((LEFT, y(axes_top + WORLD_H), RIGHT - LEFT, WORLD_H / height))
    strip: Axes = fig.add_axes((LEFT, y(strip_top + STRIP_H), RIGHT - LEFT, STRIP_H / height), sharex=ax)
    fig.suptitle(title_text(tl), x=LEFT, y=y(TOP_PAD), ha="left", va="top", fontsize=TITLE_FONT)
    if lost:
        fig.text(LEFT, y(TOP_PAD + TITLE_H), lost, ha="left", va="top", fontsize=LOST_FONT, color="#455a64")
    ax.set_xlim(0, xmax)
    top = ax.get_xaxis_transform()  # x in data, y in axes fractions

    # Generations: alternating bands under everything (one collection per
    # shade, so thousands of them stay two SVG groups), labelled at the top
    # while few, each where its band has room for it.
    bands = generation_bands(tl, span)
    shades: Tuple[List[List[Tuple[float, float]]], List[List[Tuple[float, float]]]] = ([], [])
    for i, (_, a_s, b_s) in enumerate(bands):
        a, b = a_s / per, b_s / per
        shades[i % 2].append([(a, 0.0), (b, 0.0), (b, 1.0), (a, 1.0)])
    for verts, color in zip(shades, ("#e3ebf4", "#f1f1e8")):
        if verts:
            ax.add_collection(mcollections.PolyCollection(verts, facecolors=color, edgecolors="none",
                                                          transform=top, zorder=0))
    if 0 < len(tl.generations) <= MAX_GENERATION_LABELS:
        for g, a_s, b_s in bands:
            text = f"g{g.number}"
            if _text_width(text, axes_w) <= (b_s - a_s) / span:
                ax.text((a_s + b_s) / 2 / per, BAND_LABEL_Y, text, transform=top, ha="center", va="top",
                        fontsize=LABEL_FONT, color="#546e7a", zorder=1)
    elif tl.generations:
        ax.text(1.0, 1.005, f"{len(tl.generations)} generations", transform=ax.transAxes, ha="right",
                va="bottom", fontsize=LABEL_FONT, color="#546e7a")

    # Events: a thin line each, one marker line per kind (its legend entry),
    # labels in rows above the world line where there is room.
    if tl.events:
        colors = [EVENT_STYLES.get(e.kind, OTHER_EVENT_STYLE)[0] for e in tl.events]
        segments = [[(at(e) / per, 0.0), (at(e) / per, MARKER_Y)] for e in tl.events]
        ax.add_collection(mcollections.LineCollection(segments, colors=colors, linewidths=0.6, transform=top,
                                                      alpha=0.55 if len(tl.events) <= 100 else 0.3, zorder=2,
                                                      gid="event-lines"))
    event_handles = []
    for kind, label in zip(kinds, event_labels):
        color, marker = EVENT_STYLES.get(kind, OTHER_EVENT_STYLE)
        xs = [at(e) / per for e in tl.events if e.kind == kind]
        ax.plot(xs, [MARKER_Y] * len(xs), linestyle="none", marker=marker, markersize=6, color=color,
                markeredgecolor="white", markeredgewidth=0.5, transform=top, zorder=4, clip_on=False,
                gid=f"events-{_id_part(kind)}")
        event_handles.append(mlines.Line2D([], [], linestyle="none", marker=marker, color=color, markersize=6,
                                           label=label))
    rows_used = 0
    for e, text, place in zip(candidates, texts, places):
        if place is None:
            continue
        row, right_aligned = place
        rows_used = max(rows_used, row + 1)
        padded = text + " " if right_aligned else " " + text
        ax.text(at(e) / per, LABEL_ROWS[row], padded, transform=top, ha="right" if right_aligned else "left",
                va="center", fontsize=LABEL_FONT, color=EVENT_STYLES.get(e.kind, OTHER_EVENT_STYLE)[0],
                zorder=5, clip_on=False,
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "alpha": 0.8, "edgecolor": "none"})

    # World size: a step line; its top is kept below the label rows in use.
    if tl.world:
        xs = [t / per for t, _ in tl.world] + [max(xmax, tl.world[-1][0] / per)]
        ys = [n for _, n in tl.world] + [tl.world[-1][1]]
        ax.fill_between(xs, ys, step="post", color="#1f4e79", alpha=0.12, linewidth=0, zorder=1)
        ax.step(xs, ys, where="post", color="#1f4e79", linewidth=1.4, zorder=3)
        peak = max(max(ys), 1.0)
    else:
        ax.text(0.5, 0.4, "no world-size data", transform=ax.transAxes, ha="center", color="#757575")
        peak = 1.0
    data_top = (LABEL_ROWS[rows_used - 1] - 0.06) if rows_used else MARKER_Y - 0.07
    ax.set_ylim(0, peak / data_top)
    ax.yaxis.set_major_locator(mticker.MaxNLocator(integer=True))
    ax.set_ylabel("world size (ranks)")
    ax.tick_params(labelbottom=False)
    ax.spines[["top", "right"]].set_visible(False)

    # Phases: one bar collection per kind; the legend adds up each kind's time
    # (a kind may have time and no interval: rolled-back steps).
    for kind in [k for k in PHASE_COLORS if k in bars] + sorted(set(bars) - set(PHASE_COLORS)):
        strip.broken_barh(bars[kind], (0, 1), facecolors=PHASE_COLORS.get(kind, OTHER_PHASE_COLOR),
                          edgecolors="none", gid=f"phases-{_id_part(kind)}")
    phase_handles = [mpatches.Patch(facecolor=PHASE_COLORS.get(kind, OTHER_PHASE_COLOR), label=label)
                     for kind, label in zip(phase_kinds, phase_labels)]
    if not tl.phases:
        strip.text(0.5, 0.5, "no phase data", transform=strip.transAxes, ha="center", va="center",
                   fontsize=LABEL_FONT, color="#757575")
    strip.set_ylim(0, 1)
    strip.set_yticks([])
    strip.set_ylabel("phase", rotation=0, ha="right", va="center")
    strip.set_xlabel(f"time since job start ({unit})")
    strip.set_xlim(0, xmax)

    # The legends in one band under the axis label: phases left, events right.
    for handles, title, x, loc in ((phase_handles, phase_title, LEFT, "upper left"),
                                   (event_handles, event_title, RIGHT, "upper right")):
        if handles:
            fig.legend(handles=handles, loc=loc, bbox_to_anchor=(x, y(legend_top)), ncol=-(-len(handles) // rows),
                       fontsize=LEGEND_FONT, frameon=False, title=title, title_fontsize=LEGEND_FONT,
                       borderaxespad=0)
    return fig


_DOCTYPE = re.compile(r"<!DOCTYPE[^>]*>\s*", re.S)
_XML_DECL = re.compile(r"<\?xml[^>]*\?>\s*")


def render_svg(tl: Timeline) -> str:
    """The figure as SVG text: text kept as text, ids salted with a constant
    (the same input gives the same bytes), no date, and no DOCTYPE (its DTD
    is the one URL matplotlib writes that is not a namespace)."""
    import matplotlib  # type: ignore[import-untyped, import-not-found, unused-ignore]
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": SVG_SALT, "font.size": 9}):
        fig = draw(tl)
        out = io.BytesIO()
        fig.savefig(out, format="svg", metadata={"Title": title_text(tl), "Date": None, "Type": None,
                                                 "Creator": "erun report"})
    return _DOCTYPE.sub("", out.getvalue().decode("utf-8"), count=1)


HTML_STYLE = """\
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em; color: #212121; background: #fff; }
h1 { font-size: 1.3em; font-weight: 600; }
.figure svg { max-width: 100%; height: auto; }
pre { background: #f5f7f9; border: 1px solid #e0e4e8; padding: 1em; overflow-x: auto;
      font-size: 0.85em; line-height: 1.35; }
"""


def render_html(tl: Timeline) -> str:
    """One self-contained page: the title, the SVG inline, the text summary.
    Its content security policy refuses anything loaded from elsewhere."""
    svg = _XML_DECL.sub("", render_svg(tl), count=1).strip()
    title = html.escape(title_text(tl))
    summary = f"<pre>{html.escape(tl.summary_text.rstrip())}</pre>\n" if tl.summary_text.strip() else ""
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{title}</title>\n<style>\n{HTML_STYLE}</style>\n</head>\n<body>\n<h1>{title}</h1>\n"
            f"<div class=\"figure\">\n{svg}\n</div>\n{summary}</body>\n</html>\n")


# --- the command -------------------------------------------------------------

def write_private(path: str, data: bytes) -> None:
    """Replaces ``path`` with a 0600 file holding ``data``, atomically: a new
    file beside it (mkstemp: O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600) renamed
    over it. A symlink at ``path`` is replaced, never followed."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path)[:100] + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _fail(message: str, code: int) -> int:
    print(f"erun report: {message}", file=sys.stderr)
    return code


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _Parser(prog="python3 -m erun.report",
                     description="Draw an erun job's timeline JSON (read from stdin) as SVG or HTML.")
    parser.add_argument("--format", choices=("svg", "html"), help="default: from the output file's suffix")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write")
    try:
        args = parser.parse_args(argv)
    except _UsageError as e:
        return _fail(str(e), 2)
    output: str = args.output
    fmt: Optional[str] = args.format or FORMATS.get(os.path.splitext(output)[1].lower())
    if fmt is None:
        return _fail(f"cannot tell the format of {output} from its suffix: name it .svg, .html or .htm, "
                     f"or give --format svg|html", 2)

    data = sys.stdin.buffer.read()
    try:
        if not data.strip():
            raise BadTimeline("no timeline on stdin (expected the timeline JSON)")
        try:
            doc: Any = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise BadTimeline(f"the timeline on stdin is not JSON: {e}") from None
        timeline = parse_timeline(doc)
    except BadTimeline as e:
        return _fail(str(e), 2)

    try:
        import matplotlib  # type: ignore[import-untyped, import-not-found, unused-ignore]  # noqa: F401
    except ImportError:
        print(NO_MATPLOTLIB, file=sys.stderr)
        return 3
    text = render_svg(timeline) if fmt == "svg" else render_html(timeline)
    try:
        write_private(output, text.encode("utf-8"))
    except OSError as e:
        return _fail(f"cannot write {output}: {e.strerror or e}", 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
