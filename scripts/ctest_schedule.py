#!/usr/bin/env python3
"""The order ctest starts the tests in: writes tests/ctest_schedule.txt, which
scripts/test.sh installs as ctest's cost data before every run.

ctest starts the runnable test with the highest cost first. Without cost data
(a fresh clone: CI) it starts them in the order they were added, so the long
lanes of tests that must run one at a time (their RESOURCE_LOCK,
tests/CMakeLists.txt) start late and end the run alone. Here each test of a
lane is ranked by the work left in its lane from it on (its lane's tests
taken longest first): the lane with the most left always goes first, and the
lanes end together. A test outside the lanes is ranked by its own time; a
test this file does not name (a new one) starts after the named ones.

    ctest --test-dir build --timeout 300 -j3 | tee /tmp/ctest.log
    python3 scripts/ctest_schedule.py --build build /tmp/ctest.log > tests/ctest_schedule.txt

The durations come from ctest's console log ("Test #N: NAME ... Passed  12.3
sec"); with several logs, each test's mean. --simulate prints the run time
this order and ctest's own orders would give with those durations (3 at a
time, the locks and RUN_SERIAL as ctest treats them), instead of the file.
"""
import argparse
import collections
import json
import re
import subprocess
import sys

LINE = re.compile(r"Test\s+#\d+: (\S+) \.+.*?\s(\d+\.\d+) sec")


def durations(logs):
    seen = collections.defaultdict(list)
    for path in logs:
        with open(path, errors="replace") as f:
            for line in f:
                m = LINE.search(line)
                if m:
                    seen[m.group(1)].append(float(m.group(2)))
    return {name: sum(v) / len(v) for name, v in seen.items()}


def tests_of(build):
    out = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"], capture_output=True, text=True,
                         check=True).stdout
    tests = []
    for i, t in enumerate(json.loads(out)["tests"]):
        lock, serial = None, False
        for p in t.get("properties", []):
            if p["name"] == "RESOURCE_LOCK":
                lock = p["value"][0]
            elif p["name"] == "RUN_SERIAL" and p["value"]:
                serial = True
        tests.append({"name": t["name"], "index": i, "lock": lock, "serial": serial})
    return tests


def ranks(tests, took):
    """Each test's rank: the work left in its lane from it on, or its own time."""
    lanes = collections.defaultdict(list)
    out = {}
    for t in tests:
        d = took.get(t["name"])
        if d is None:
            continue
        if t["lock"] and not t["serial"]:
            lanes[t["lock"]].append((d, t["name"]))
        else:
            out[t["name"]] = d
    for members in lanes.values():
        members.sort(reverse=True)
        left = sum(d for d, _ in members)
        for d, name in members:
            out[name] = left
            left -= d
    return out


def simulate(tests, took, rank, slots=3):
    """The run time with ctest's rules: the highest-ranked runnable test first;
    a held lock skips a test; a RUN_SERIAL test starts only when none runs and
    none starts beside it."""
    pending = sorted(tests, key=lambda t: (-rank(t), t["index"]))
    running, locks, now, serial = [], set(), 0.0, False
    while pending or running:
        if not serial:
            for t in list(pending):
                if len(running) >= slots:
                    break
                if t["serial"]:
                    if running:
                        continue
                    serial = True
                elif t["lock"] in locks:
                    continue
                pending.remove(t)
                running.append((now + took.get(t["name"], 0.01), t))
                if t["lock"]:
                    locks.add(t["lock"])
                if serial:
                    break
        running.sort(key=lambda r: r[0])
        now, t = running.pop(0)
        locks.discard(t["lock"])
        serial = serial and not t["serial"]
    return now


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--simulate", action="store_true")
    ap.add_argument("logs", nargs="+", help="ctest console logs of whole runs")
    args = ap.parse_args()
    took = durations(args.logs)
    tests = tests_of(args.build)
    rank = ranks(tests, took)
    if args.simulate:
        known = sum(1 for t in tests if t["name"] in took)
        print(f"{known} of {len(tests)} tests have a duration in the logs")
        print(f"this order (the lanes' work left): {simulate(tests, took, lambda t: rank.get(t['name'], 0)):.0f} s")
        print(f"ctest by the tests' own times:     {simulate(tests, took, lambda t: took.get(t['name'], 0)):.0f} s")
        print(f"ctest without cost data:           {simulate(tests, took, lambda t: 0):.0f} s")
        return 0
    for name, r in sorted(rank.items(), key=lambda x: (-x[1], x[0])):
        if r >= 0.05:  # the unit tests' order does not matter
            print(f"{name} 1 {r:.2f}")
    print("---")
    return 0


if __name__ == "__main__":
    sys.exit(main())
