#!/usr/bin/env python3
"""SM clock and power of each run's steady steps: nvidia-smi samples (every 20 ms) between the
time-stamped log lines of step FIRST and the last step; medians of the SM clock and power, the
share of samples with the software power cap active. Usage: clock.py LOGDIR [FIRST]"""
import datetime, glob, os, re, statistics, sys

d = sys.argv[1]
first = int(sys.argv[2]) if len(sys.argv) > 2 else 5
rows = []
for log in sorted(glob.glob(os.path.join(d, "train_*.log"))):
    tag = os.path.basename(log)[6:-4]
    t0 = open(os.path.join(d, f"t0_{tag}.txt")).read().split(maxsplit=1)
    epoch0 = float(t0[0])
    wall0 = datetime.datetime.strptime(t0[1].strip()[:26], "%Y/%m/%d %H:%M:%S.%f")
    steps = {}
    toks = None
    for line in open(log):
        ts, _, rest = line.partition(" ")
        m = re.search(r"step\s+(\d+)/(\d+)", rest)
        if m and "val" not in rest:
            steps[int(m.group(1))] = float(ts)
        m = re.search(r"(\d+) tok/s", rest)
        if rest.startswith("done:") and m:
            toks = int(m.group(1))
    if first not in steps:
        print(f"{tag}: no step {first} in the log"); continue
    lo, hi = steps[first], steps[max(steps)]
    clk, pw, cap = [], [], []
    for line in open(os.path.join(d, f"smi_{tag}.csv")):
        f = [x.strip() for x in line.split(",")]
        try:
            w = datetime.datetime.strptime(f[0][:23], "%Y/%m/%d %H:%M:%S.%f")
        except ValueError:
            continue
        t = epoch0 + (w - wall0).total_seconds()
        if lo <= t <= hi:
            clk.append(float(f[1])); pw.append(float(f[3]))
            if len(f) > 5: cap.append(f[5] == "Active")
    if not clk:
        print(f"{tag}: no samples"); continue
    rows.append((tag, toks, len(clk), statistics.median(clk), statistics.mean(clk), statistics.median(pw),
                 (100.0 * sum(cap) / len(cap)) if cap else float("nan")))
print(f"{'run':22s} {'tok/s':>8s} {'n':>5s} {'SM MHz med':>10s} {'mean':>7s} {'W med':>6s} {'cap %':>6s}")
for r in rows:
    print(f"{r[0]:22s} {r[1] or 0:8d} {r[2]:5d} {r[3]:10.0f} {r[4]:7.0f} {r[5]:6.0f} {r[6]:6.1f}")
