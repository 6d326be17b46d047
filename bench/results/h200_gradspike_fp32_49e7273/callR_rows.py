# Rows where the paths' forward residual streams part: for the rows of x[LAST] that differ most
# between unfused and coda, each layer's relative row error of each path against the CPU reference,
# and the row's LayerNorm statistics (mu, sigma, |mu|/sigma) from the CPU values.
import sys, os, numpy as np
cpu, unf, coda = sys.argv[1:4]
C, T = 1024, 1024
layers = sorted({int(f[2:-4]) for f in os.listdir(cpu) if f.startswith("x_")})
def x(d, l): return np.fromfile(f"{d}/x_{l}.f32", dtype=np.float32).astype(np.float64).reshape(-1, C)
last = layers[-1]
du = np.linalg.norm(x(coda, last) - x(unf, last), axis=1) / np.linalg.norm(x(unf, last), axis=1)
rows = list(np.argsort(-du)[:6])
print("rows (b, t):", [(int(r) // T, int(r) % T) for r in rows], "coda-vs-unfused at x[%d]:" % last, " ".join("%.3f" % du[r] for r in rows))
for l in layers:
    X, U, K = x(cpu, l), x(unf, l), x(coda, l)
    eu = np.linalg.norm(U - X, axis=1) / np.linalg.norm(X, axis=1)
    ek = np.linalg.norm(K - X, axis=1) / np.linalg.norm(X, axis=1)
    mu, sd = X.mean(axis=1), X.std(axis=1)
    print(f"x[{l}] all rows: unfused median {np.median(eu):.2e} max {eu.max():.2e} @ {int(np.argmax(eu))//T},{int(np.argmax(eu))%T}; "
          f"coda median {np.median(ek):.2e} max {ek.max():.2e} @ {int(np.argmax(ek))//T},{int(np.argmax(ek))%T}; |mu|/sd median {np.median(np.abs(mu)/sd):.2f} max {np.max(np.abs(mu)/sd):.1f}")
    print("   rows: " + "  ".join(f"u {eu[r]:.1e} c {ek[r]:.1e} mu {mu[r]:.2f} sd {sd[r]:.3f}" for r in rows[:4]))
for name in ("qkv", "y"):
    for l in layers:
        f = f"{cpu}/{name}_{l}.f32"
        if not os.path.exists(f): continue
        w = 3 * C if name == "qkv" else C
        X = np.fromfile(f, dtype=np.float32).astype(np.float64).reshape(-1, w)
        U = np.fromfile(f"{unf}/{name}_{l}.f32", dtype=np.float32).astype(np.float64).reshape(-1, w)
        K = np.fromfile(f"{coda}/{name}_{l}.f32", dtype=np.float32).astype(np.float64).reshape(-1, w)
        eu = np.linalg.norm(U - X, axis=1) / np.linalg.norm(X, axis=1); ek = np.linalg.norm(K - X, axis=1) / np.linalg.norm(X, axis=1)
        print(f"{name}[{l}]: unfused median {np.median(eu):.2e} max {eu.max():.2e}; coda median {np.median(ek):.2e} max {ek.max():.2e}; rows: " +
              " ".join(f"u {eu[r]:.1e}/c {ek[r]:.1e}" for r in rows[:4]))
