# Loops (backward branches) of `cuobjdump -sass` functions and their instruction mix, static counts:
#   python3 sass_loops.py FILE.sass SUBSTRING...   (functions whose name holds any SUBSTRING)
import re, sys, collections
text = open(sys.argv[1]).read()
funcs = re.split(r'\n\s*Function : ', text)
want = sys.argv[2:]
for f in funcs[1:]:
    name = f.split('\n',1)[0].strip()
    short = re.sub(r'.*Config\w+?EEE', '', name)[:60]
    if not any(w in name for w in want): continue
    insts = []; at = {}
    for ln in f.split('\n'):
        m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;', ln)
        if m:
            at[int(m.group(1),16)] = len(insts)
            body = m.group(2).strip()
            op = re.sub(r'^@!?U?P[T0-9]\s+', '', body).split()[0]
            insts.append((op, body))
    print('==', short, len(insts), 'instructions')
    loops = []
    for i, (op, body) in enumerate(insts):
        if op == 'BRA':
            m = re.search(r'BRA\s+(?:`\()?0x([0-9a-f]+)', body)
            if m:
                t = at.get(int(m.group(1),16))
                if t is not None and t < i and i + 1 - t >= 60: loops.append((t, i))
    for s, e in loops:
        ops = collections.Counter(o.split('.')[0] for o, _ in insts[s:e+1])
        top = ', '.join(f'{o}:{c}' for o, c in ops.most_common(16))
        print(f'  loop [{s},{e}] {e+1-s} instr: {top}')
