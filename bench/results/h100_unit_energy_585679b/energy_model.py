#!/usr/bin/env python3
"""Joules of a GEMM call split by resource, from this folder's files: call2/unit_energy.json
(bench_wgmma --energy: W idle, pJ a flop by wgmma pattern, pJ a byte of bulk copies from L2 and
DRAM), call2/ncu_copies.csv (Nsight Compute's L2 and DRAM bytes of those copies),
call1/ and call3/gemm_energy.json (bench_gemm --energy --sweep: J a call, back to back) and
call1/ and call3/ncu_<shape>.csv (the same GEMMs' L2 and DRAM bytes). Prints, per GEMM contender: measured J
a call, the idle watts' share over its time, its L2 and DRAM bytes priced by the copies, and what
is left for the tensor work, as pJ a flop against the wgmma patterns' own; then (with numpy) least
squares fits of J a call over the 16 contenders on flops, time, L2 and DRAM bytes.
usage: energy_model.py [FOLDER]   (default: the script's own folder)"""
import csv, json, re, statistics, sys, os

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))

def ncu(path):
    """{kernel label: {metric: median over launches}} from an ncu --csv file."""
    rows = {}
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        rows.setdefault((r["ID"], r["Kernel Name"]), {})[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
    out = {}
    for (i, name), m in sorted(rows.items(), key=lambda kv: int(kv[0][0])):
        out.setdefault(label(name), []).append(m)
    return {k: {m: statistics.median(x[m] for x in v) for m in v[0]} | {"launches": len(v)} for k, v in out.items()}

def label(name):
    m = re.search(r"Config<(\d+), (\d+), (\d+), (true|false|1|0), (\d+)>", name)
    if m:
        bm, bn, _, pp, cl = m.groups()
        return ("pp" if pp in ("true", "1") else "") + f"{bm}x{bn}" + ("c" + cl if cl != "1" else "")
    if "nvjet" in name: return "cuBLASLt " + name.split("nvjet_sm90_")[1][:24]
    if "bulk_copy" in name: return "bulk_copy"
    if "wgmma_copy" in name: return "wgmma_copy"
    return name[:40]

units = json.load(open(os.path.join(d, "call2", "unit_energy.json")))
idle_w = next(u["w"] for u in units if u["part"] == "idle")
print(f"idle (every SM asleep): {idle_w:.0f} W")
pat = {u["pattern"]: u for u in units if u["part"] == "wgmma"}
for k, u in pat.items():
    print(f"  {k:26s} {u['w']:5.0f} W {u['sm_mhz']:6.0f} MHz {u['tflops']:5.0f} TF/s {u['pj_flop']:.4f} pJ/flop, above idle {u['pj_flop_above_idle']:.4f}")
cp = {u["pattern"]: u for u in units if u["part"] == "copy"}
for k, u in cp.items():
    print(f"  {k:26s} {u['w']:5.0f} W {u['sm_mhz']:6.0f} MHz {u['gbs']:6.0f} GB/s {u['pj_byte']:.2f} pJ/B, above idle {u['pj_byte_above_idle']:.2f}")
mix = [u for u in units if u["part"] == "wgmma+copy"]
for u in mix:
    print(f"  wgmma + L2 copies: {u['j']:.4f} J a launch against {u['j_from_parts']:.4f} from the parts ({u['j']/u['j_from_parts']:.3f}x)")

# The copies' bytes by Nsight Compute's counters: J above idle a counted byte.
nc = os.path.join(d, "call2", "ncu_copies.csv")
e_l2 = e_dram = None
if os.path.exists(nc):
    with open(nc) as f:
        lines = [l for l in f if l.startswith('"')]
    per = {}
    for r in csv.DictReader(lines):
        per.setdefault((int(r["ID"]), r["Kernel Name"]), {})[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
    launches = [(label(n), m) for (i, n), m in sorted(per.items())]
    copies = [m for l, m in launches if l == "bulk_copy"]
    # Launch order: the L2 copies first (all with little DRAM traffic), then the DRAM ones.
    l2 = [m for m in copies if m["dram__bytes_read.sum"] < 0.1 * m["lts__t_bytes.sum"]]
    dr = [m for m in copies if m["dram__bytes_read.sum"] >= 0.1 * m["lts__t_bytes.sum"]]
    def med(ms, k): return statistics.median(m[k] for m in ms)
    copied = 16384 * 4096 * 132  # bulk_copy_loop's bytes a launch at --iters any (pieces fixed)
    print(f"ncu, a bulk copy launch of {copied/1e9:.2f} GB: from L2 ({len(l2)} launches) L2 {med(l2,'lts__t_bytes.sum')/1e9:.2f} GB, "
          f"DRAM rd {med(l2,'dram__bytes_read.sum')/1e9:.3f}; from DRAM ({len(dr)}) L2 {med(dr,'lts__t_bytes.sum')/1e9:.2f} GB, DRAM rd {med(dr,'dram__bytes_read.sum')/1e9:.2f}")
    j_l2 = cp["bulk copy from L2"]["pj_byte_above_idle"] * copied * 1e-12
    j_dr = cp["bulk copy from DRAM"]["pj_byte_above_idle"] * copied * 1e-12
    e_l2 = j_l2 / med(l2, "lts__t_bytes.sum") * 1e12
    e_dram = (j_dr - e_l2 * 1e-12 * med(dr, "lts__t_bytes.sum")) / med(dr, "dram__bytes_read.sum") * 1e12
    print(f"=> above idle: {e_l2:.2f} pJ a counted L2 byte, {e_dram:.2f} pJ a DRAM byte beyond its L2 bytes")

ge = [os.path.join(d, c, "gemm_energy.json") for c in ("call1", "call3")]
fit_rows = []
if e_l2 is not None:
    recs = [r for g in ge if os.path.exists(g) for r in json.load(open(g)) if r["program"] == "plain:energy"]
    for gemm in dict.fromkeys(r["gemm"] for r in recs):
        tag = "1.5b_" + gemm.replace(" ", "_")
        path = next((p for p in (os.path.join(d, c, f"ncu_{tag}.csv") for c in ("call1", "call3")) if os.path.exists(p)), "")
        counters = ncu(path) if os.path.exists(path) else {}
        rs = [r for r in recs if r["gemm"] == gemm]
        s = rs[0]["shape"]; flop = 2.0 * s["M"] * s["N"] * s["K"]
        print(f"\n{gemm} ({s['M']} x {s['N']} x {s['K']}, {flop/1e9:.0f} GFLOP): J a call back to back; idle W x time; L2 and DRAM bytes (ncu) priced; the rest a flop")
        rows = [("cuBLASLt", rs[0]["cublaslt_ms"], rs[0]["cublaslt_j"], next((v for k, v in counters.items() if k.startswith("cuBLASLt")), None))]
        seen = set()
        for r in rs:
            if r["tile"] in seen: continue
            seen.add(r["tile"])
            base = r["tile"].split("/")[0]
            rows.append((r["tile"], r["ours_ms"], r["ours_j"], counters.get(base)))
        print(f"  {'contender':14s} {'ms':>7s} {'J':>7s} {'idle J':>7s} {'L2 GB':>6s} {'L2 J':>6s} {'DRAM GB':>7s} {'DRAM J':>6s} {'rest J':>7s} {'pJ/flop':>7s}")
        for name, ms, j, c in rows:
            ij = idle_w * ms * 1e-3
            if c: fit_rows.append((f"{gemm} {name}", flop, ms * 1e-3, c["lts__t_bytes.sum"], c["dram__bytes_read.sum"] + c["dram__bytes_write.sum"], j))
            if c:
                l2b = c["lts__t_bytes.sum"]; drb = c["dram__bytes_read.sum"] + c["dram__bytes_write.sum"]
                l2j = l2b * e_l2 * 1e-12; drj = drb * e_dram * 1e-12
                rest = j - ij - l2j - drj
                print(f"  {name:14s} {ms:7.4f} {j:7.4f} {ij:7.4f} {l2b/1e9:6.2f} {l2j:6.4f} {drb/1e9:7.3f} {drj:6.4f} {rest:7.4f} {rest/flop*1e12:7.4f}")
            else:
                print(f"  {name:14s} {ms:7.4f} {j:7.4f} {ij:7.4f}  (no ncu counters)")

try:
    import numpy as np
except ImportError:
    np = None
if np is not None and fit_rows:
    X = np.array([r[1:5] for r in fit_rows]); y = np.array([r[5] for r in fit_rows])
    # (DRAM bytes move with L2 bytes in these contenders, so their own price is hardly identified;
    # the copies above give it.)
    print(f"\nleast squares over the {len(y)} contenders, J a call (rms and largest relative error of the fit):")
    for cols, lab in [([0], "flop"), ([0, 2], "flop, L2 bytes"), ([0, 2, 3], "flop, L2, DRAM bytes")]:
        coef = np.linalg.lstsq(X[:, cols], y, rcond=None)[0]
        err = (X[:, cols] @ coef - y) / y
        unit = {0: "pJ/flop", 2: "pJ/L2 B", 3: "pJ/DRAM B"}
        terms = ", ".join(f"{c * 1e12:.3f} {unit[i]}" for i, c in zip(cols, coef))
        print(f"  {lab:22s} {terms:60s} rms {100 * np.sqrt(np.mean(err ** 2)):.1f}%, max {100 * np.max(np.abs(err)):.1f}%")
    yy = y - idle_w * X[:, 1]
    coef = np.linalg.lstsq(X[:, [0, 2]], yy, rcond=None)[0]
    err = (X[:, [0, 2]] @ coef + idle_w * X[:, 1] - y) / y
    print(f"  idle {idle_w:.0f} W x time, then flop and L2 bytes: {coef[0] * 1e12:.3f} pJ/flop, {coef[1] * 1e12:.2f} pJ/L2 B; "
          f"rms {100 * np.sqrt(np.mean(err ** 2)):.1f}%, max {100 * np.max(np.abs(err)):.1f}%")
