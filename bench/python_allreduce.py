"""Allreduce of a torch CPU tensor (float32 sum) through the erun Python
package vs torch.distributed Gloo, same sizes, same method, same run.

    /usr/bin/python3 bench/python_allreduce.py [--np 2 4] [--sizes BYTES...]

Needs the built package (PYTHONPATH=build/python) and build/src/runner/erun.
Method (as bench/torch_allreduce.py): 3 warm-ups, then clamp(256 MiB / bytes,
5, 1000) timed ops; the slowest rank's mean time. Prints one line per size
with both times and erun's speed-up; `--worker` is the erun side's rank.
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]


def iters_for(nbytes):
    return max(5, min(1000, (256 << 20) // max(nbytes, 1)))


def worker(sizes):
    import torch
    import erun
    torch.set_num_threads(1)
    erun.init()
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        iters = iters_for(nbytes)
        for _ in range(3):
            erun.allreduce_(t, op=erun.Sum)
        erun.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            erun.allreduce_(t, op=erun.Sum)
        el = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        erun.allreduce_(el, op=erun.Max)
        if erun.rank() == 0:
            print(f"np={erun.size()} bytes={nbytes} iters={iters} time={el.item() * 1e6:.1f} us", flush=True)


def times(text):
    return {int(b): float(t) for b, t in re.findall(r"bytes=(\d+) iters=\d+ time=([0-9.]+) us", text)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--np", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    ap.add_argument("--worker", action="store_true")
    o = ap.parse_args()
    if o.worker:
        worker(o.sizes)
        return 0
    build = pathlib.Path(os.environ.get("ERUN_BUILD_DIR", ROOT / "build"))
    env = dict(os.environ, PYTHONPATH=str(build / "python"))
    sizes = [str(s) for s in o.sizes]
    print(f"{'np':>3} {'bytes':>10} {'erun us':>11} {'gloo us':>11} {'erun GB/s':>10} {'speed-up':>9}  target")
    ok = True
    for n in o.np:
        e = subprocess.run([str(build / "src/runner/erun"), "-np", str(n), sys.executable, __file__, "--worker",
                            "--sizes", *sizes], env=env, capture_output=True, text=True, timeout=1200)
        g = subprocess.run([sys.executable, str(ROOT / "bench/torch_allreduce.py"), str(n), *sizes], env=env,
                           capture_output=True, text=True, timeout=1200)
        te, tg = times(e.stdout), times(g.stdout)
        if e.returncode or g.returncode or len(te) != len(o.sizes) or len(tg) != len(o.sizes):
            print(e.stdout, e.stderr, g.stdout, g.stderr, file=sys.stderr)
            return 1
        for s in o.sizes:
            ratio = tg[s] / te[s]
            ok &= ratio > 1
            busbw = s / (te[s] * 1e-6) / 1e9 * 2 * (n - 1) / n
            print(f"{n:>3} {s:>10} {te[s]:>11.1f} {tg[s]:>11.1f} {busbw:>10.2f} {ratio:>8.1f}x  "
                  f"{'met' if ratio > 1 else 'NOT met'}", flush=True)
    print("erun faster at every size:", "met" if ok else "NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
