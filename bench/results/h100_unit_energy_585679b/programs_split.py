#!/usr/bin/env python3
"""The 1.5B fused programs' joules against the plain GEMMs' prices: J a call back to back (call 1's
printed lines, call1/output_tail.txt) beside Nsight's L2 and DRAM bytes of the same programs
(call3/ncu_programs.csv, bench_gemm --only none --reps 1: each program's plain GEMM, then the
program, 4 rounds). Model: the idle watts x time + a price a flop + a price a counted L2 byte, as
energy_model.py fits them over the plain GEMMs (its last line); what is left is the programs' DRAM
bytes and epilogue arithmetic. usage: programs_split.py [FOLDER]"""
import csv, os, statistics, sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
IDLE_W, PJ_FLOP, PJ_L2 = 124.0, 0.764, 17.79  # energy_model.txt: idle fixed, flop and L2 bytes, 24 GEMMs
per = {}
with open(os.path.join(d, "call3", "ncu_programs.csv")) as f:
    for r in csv.DictReader(l for l in f if l.startswith('"')):
        per.setdefault(int(r["ID"]), {})[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
launches = [per[i] for i in sorted(per)]
# (name, M, N, K, program ms, program J, plain ms, plain J): call1/output_tail.txt, in bench_gemm's order
programs = [("QkvForward", 16384, 4800, 1600, 0.4152, 0.2981, 0.4211, 0.2896),
            ("ResidualForward proj", 16384, 1600, 1600, 0.1702, 0.1159, 0.1394, 0.1005),
            ("ResidualForward fcproj", 16384, 1600, 6400, 0.5297, 0.3712, 0.4893, 0.3438),
            ("FcForward", 16384, 6400, 1600, 0.5866, 0.4085, 0.5670, 0.3936),
            ("LmHeadForward", 16384, 50304, 1600, 4.9951, 3.4627, 4.3543, 3.0908),
            ("GeluBackward", 16384, 6400, 1600, 0.7503, 0.5329, 0.5691, 0.3882),
            ("LnBackwardX", 16384, 1600, 6400, 0.6323, 0.4448, 0.4959, 0.3491)]
print(f"model: {IDLE_W:.0f} W x time + {PJ_FLOP} pJ a flop + {PJ_L2} pJ a counted L2 byte; rest = measured - model")
print(f"{'program':24s} {'which':6s} {'ms':>7s} {'J':>7s} {'L2 GB':>7s} {'DRAM GB':>7s} {'model J':>7s} {'rest J':>7s} {'rest':>6s}")
for k, (name, M, N, K, pms, pj, qms, qj) in enumerate(programs):
    rounds = launches[8 * k:8 * k + 8]  # plain, program, 4 times
    flop = 2.0 * M * N * K
    for which, ms, j, rows in (("plain", qms, qj, rounds[0::2]), ("prog", pms, pj, rounds[1::2])):
        l2 = statistics.median(r["lts__t_bytes.sum"] for r in rows)
        dram = statistics.median(r["dram__bytes_read.sum"] + r["dram__bytes_write.sum"] for r in rows)
        model = IDLE_W * ms * 1e-3 + (PJ_FLOP * flop + PJ_L2 * l2) * 1e-12
        print(f"{name:24s} {which:6s} {ms:7.4f} {j:7.4f} {l2 / 1e9:7.3f} {dram / 1e9:7.3f} {model:7.4f} {j - model:7.4f} {100 * (j - model) / j:5.1f}%")
