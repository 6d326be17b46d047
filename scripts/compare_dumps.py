#!/usr/bin/env python3
"""Row-by-row comparison of CODAGPT_DUMP directories (src/tensor_dump.hpp) of the same step on
different paths, against the first directory:

    python3 scripts/compare_dumps.py --seq-len T --embd C --heads NH REF_DIR DIR [DIR...]

For each tensor and layer present in every directory (top layer first, in the order the step
makes them): the relative difference of the whole tensor, ||a - ref|| / ||ref||; its median and
largest over rows (tokens), and the token (batch, position) of the largest; how many rows differ
more than 10x the median; for qkv and dqkv the part (q, k, v) and head that differ most; for dout
(the gradient of the layer's output, the next layer's input x) where x of the next layer is
dumped, the shares of the difference along each row's constant vector and along its normalized x,
the directions a LayerNorm's backward removes from its input's gradient."""
import argparse
import glob
import os
import re

import numpy as np

ORDER = {"x": 0, "qkv": 1, "y": 2, "dout": 3, "dy": 4, "dqkv": 5}


def load(d, name, layer):
    return np.fromfile(os.path.join(d, f"{name}_{layer}.f32"), dtype=np.float32).astype(np.float64)


def label(d):  # the directory's name, or its parent's for grad_compare.sh's OUT/<path>/dump
    parts = os.path.normpath(os.path.abspath(d)).split(os.sep)
    return parts[-2] if parts[-1] == "dump" else parts[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--embd", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    if len(a.dirs) < 2:
        ap.error("needs a reference directory and at least one other")
    ref_dir, others = a.dirs[0], a.dirs[1:]
    T, C, NH = a.seq_len, a.embd, a.heads
    found = []
    for f in glob.glob(os.path.join(ref_dir, "*.f32")):
        m = re.fullmatch(r"([a-z]+)_(\d+)\.f32", os.path.basename(f))
        if m and all(os.path.exists(os.path.join(d, os.path.basename(f))) for d in others):
            found.append((int(m.group(2)), m.group(1)))
    found.sort(key=lambda k: (-k[0], ORDER.get(k[1], 9)))
    print(f"reference: {ref_dir}")
    for layer, name in found:
        width = 3 * C if name in ("qkv", "dqkv") else C
        ref = load(ref_dir, name, layer)
        if ref.size % width:
            print(f"{name}[{layer}]: {ref.size} values are not rows of {width}")
            continue
        R = ref.reshape(-1, width)
        row_ref = np.linalg.norm(R, axis=1)
        for d in others:
            x = load(d, name, layer)
            if x.size != ref.size:
                print(f"{name}[{layer}] {d}: {x.size} values against {ref.size}")
                continue
            diff = x.reshape(-1, width) - R
            total = np.linalg.norm(diff) / max(np.linalg.norm(R), 1e-300)
            row_rel = np.linalg.norm(diff, axis=1) / np.maximum(row_ref, 1e-30)
            med = np.median(row_rel)
            w = int(np.argmax(row_rel))
            line = (f"{name}[{layer}] {label(d)}: rel {total:.2e}; rows median {med:.2e}, "
                    f"max {row_rel[w]:.2e} at (b {w // T}, t {w % T}), |ref row| {row_ref[w]:.2e} (median "
                    f"{np.median(row_ref):.2e}); rows > 10x median: {int(np.sum(row_rel > 10 * med))}")
            if width == 3 * C:
                heads = np.sqrt((diff.reshape(-1, 3, NH, C // NH) ** 2).sum(axis=(0, 3)))
                heads /= np.maximum(np.sqrt((R.reshape(-1, 3, NH, C // NH) ** 2).sum(axis=(0, 3))), 1e-300)
                p, h = np.unravel_index(int(np.argmax(heads)), heads.shape)
                line += (f"; worst head {'qkv'[p]}{h} {heads[p, h]:.2e} (q/k/v medians "
                         + "/".join(f"{np.median(heads[i]):.2e}" for i in range(3)) + ")")
            xn = os.path.join(ref_dir, f"x_{layer + 1}.f32")
            if name == "dout" and os.path.exists(xn):
                xs = load(ref_dir, "x", layer + 1).reshape(-1, C)
                xc = xs - xs.mean(axis=1, keepdims=True)
                xhat = xc / np.maximum(np.linalg.norm(xc, axis=1, keepdims=True), 1e-30)
                ones = np.full(C, C ** -0.5)
                along1 = diff @ ones
                alongx = np.einsum("ij,ij->i", diff, xhat)
                e2 = max(float((diff ** 2).sum()), 1e-300)
                line += (f"; difference along 1: {float((along1 ** 2).sum()) / e2:.1%}, along xhat: "
                         f"{float((alongx ** 2).sum()) / e2:.1%}")
            print(line)


if __name__ == "__main__":
    main()
