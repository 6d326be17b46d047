#!/usr/bin/env python3
"""Per-layer medians of a traced step (codagpt train --trace-kernels), by a kernel's place in its layer.

usage: per_layer.py TRACE...   The forward windows start at each cuDNN attention forward, the
backward ones at each cuDNN compute_dot_do_o (so a backward window holds the rest of layer l's
attention backward and qkv stage, then layer l-1's MLP and projection). A kernel's role is its name
and its ordinal in the window; medians over the windows (n_layer - 1 of them: what follows the
last marker runs into the LM head, or into the embedding's backward, so it makes no window). It
prints the step's kernel time and each layer's; what lies outside the layers (the LM head, the
optimizer) is left to the reader's arithmetic."""
import re, statistics as st, sys
from collections import defaultdict

def load(path):
    out = []
    for line in open(path):
        m = re.match(r'\s*([0-9.]+) ms\s+[0-9.]+ idle\s+(.*)', line)
        if not m:
            continue
        n = m.group(2).replace('codagpt::(anonymous namespace)::', '')
        if 'gemm_kernel' in n:
            prog = re.findall(r'coda::(\w+)<__nv_bfloat16', n)
            n = 'engine ' + (prog[0] if prog else '?')
        else:
            n = re.sub(r'\(.*', '', n).replace('void ', '')
        out.append((float(m.group(1)), n))
    return out

def windows(ks, marker):
    at = [i for i, (_, n) in enumerate(ks) if marker in n]
    return [ks[at[j]:at[j + 1]] for j in range(len(at) - 1)]

def medians(segs):
    roles, order = defaultdict(list), []
    for s in segs:
        seen = defaultdict(int)
        for t, n in s:
            if n.startswith('[mem'):
                continue
            key = f'{n} #{seen[n]}'
            seen[n] += 1
            if key not in roles:
                order.append(key)
            roles[key].append(t)
    return [(k, st.median(roles[k])) for k in order if len(roles[k]) >= len(segs) // 2]

for path in sys.argv[1:]:
    ks = load(path)
    print(f'== {path}: {sum(t for t, _ in ks):.2f} ms of kernels in the step')
    for label, marker in (('forward', 'flash_fprop'), ('backward', 'compute_dot_do_o')):
        segs = windows(ks, marker)
        rows = medians(segs)
        for k, m in rows:
            print(f'  {m:7.3f}  {k[:96]}')
        print(f'  {sum(m for _, m in rows):7.3f}  a layer\'s {label} (medians of {len(segs)} windows)')
