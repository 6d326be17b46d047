#!/usr/bin/env python3
"""Joules of a GEMM call split by resource, from this folder's files: call2/unit_energy.json
(bench_wgmma --energy: W idle, pJ a flop by wgmma pattern, pJ a byte of bulk copies from L2 and
DRAM), call2/ncu_copies.csv (Nsight Compute's L2 and DRAM bytes of those copies),
call1/ and call3/gemm_energy.json (bench_gemm --energy --sweep: J a call, back to back) and
call1/ and call3/ncu_<shape>.csv (the same GEMMs' L2 and DRAM bytes), call1/output_tail.txt (the
1.5B fused programs' J a call, printed by bench_gemm --only none --energy 3) and
call3/ncu_programs.csv (their bytes). Prints, per GEMM contender: measured J a call, the idle
watts' share over its time, its L2 and DRAM bytes priced by the copies, and what is left for the
tensor work, as pJ a flop against the wgmma patterns' own; then (with numpy) least squares fits of
J a call over the plain GEMMs on flops, L2 and DRAM bytes, and the fused programs against the
fitted prices (what is left: their DRAM bytes and epilogue arithmetic).
usage: energy_model.py [FOLDER]   (default: the script's own folder)"""
import csv, json, re, statistics, sys, os

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))

def ncu_launches(path):
    """[(kernel label, {metric: value})] of an ncu --csv file, in launch order."""
    per = {}
    with open(path) as f:
        for r in csv.DictReader(l for l in f if l.startswith('"')):
            per.setdefault((int(r["ID"]), r["Kernel Name"]), {})[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
    return [(label(name), m) for (i, name), m in sorted(per.items())]

def ncu(path):
    """{kernel label: {metric: median over its launches}} of an ncu --csv file."""
    out = {}
    for name, m in ncu_launches(path):
        out.setdefault(name, []).append(m)
    return {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in out.items()}

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
    copies = [m for l, m in ncu_launches(nc) if l == "bulk_copy"]
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
            if c:
                l2b = c["lts__t_bytes.sum"]; drb = c["dram__bytes_read.sum"] + c["dram__bytes_write.sum"]
                fit_rows.append((flop, ms * 1e-3, l2b, drb, j))
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
    X = np.array([r[:4] for r in fit_rows]); y = np.array([r[4] for r in fit_rows])
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

    # The fused programs against these prices: J a call from the lines call 1 printed (its JSON did
    # not come back), a program after cuBLASLt's and our plain GEMM of its shape each; bytes from
    # call 3's Nsight run (each program's plain GEMM, then the program, 4 rounds).
    pj_flop, pj_l2 = coef
    shapes = [("QkvForward", 16384, 4800, 1600), ("ResidualForward proj", 16384, 1600, 1600),
              ("ResidualForward fcproj", 16384, 1600, 6400), ("FcForward", 16384, 6400, 1600),
              ("LmHeadForward", 16384, 50304, 1600), ("GeluBackward", 16384, 6400, 1600),
              ("LnBackwardX", 16384, 1600, 6400)]  # bench_gemm's order of the 1.5B programs
    runs = [(float(w[-6]), float(w[-4])) for w in (l.split() for l in open(os.path.join(d, "call1", "output_tail.txt")))
            if len(w) > 6 and w[0] == "energy" and w[-1] == "W"]  # (ms, J) of every "energy ..." line
    launches = [m for _, m in ncu_launches(os.path.join(d, "call3", "ncu_programs.csv"))]
    print(f"\nthe fused programs at {idle_w:.0f} W x time + {pj_flop * 1e12:.3f} pJ a flop + {pj_l2 * 1e12:.2f} pJ a counted L2 byte"
          " (rest: measured - model)")
    print(f"  {'program':24s} {'which':6s} {'ms':>7s} {'J':>7s} {'L2 GB':>7s} {'DRAM GB':>7s} {'model J':>7s} {'rest J':>7s} {'rest':>6s}")
    for k, (name, M, N, K) in enumerate(shapes):
        rounds = launches[8 * k:8 * k + 8]
        for which, (ms, j), rows in (("plain", runs[3 * k + 1], rounds[0::2]), ("prog", runs[3 * k + 2], rounds[1::2])):
            l2 = statistics.median(r["lts__t_bytes.sum"] for r in rows)
            dram = statistics.median(r["dram__bytes_read.sum"] + r["dram__bytes_write.sum"] for r in rows)
            model = idle_w * ms * 1e-3 + pj_flop * 2.0 * M * N * K + pj_l2 * l2
            print(f"  {name:24s} {which:6s} {ms:7.4f} {j:7.4f} {l2 / 1e9:7.3f} {dram / 1e9:7.3f} {model:7.4f} {j - model:7.4f} {100 * (j - model) / j:5.1f}%")
