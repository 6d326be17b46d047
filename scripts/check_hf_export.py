#!/usr/bin/env python3
"""Checks that a codagpt safetensors export computes, in PyTorch, the logits codagpt's CPU reference does.

    codagpt export --checkpoint ckpt.bin --out model.safetensors --reference-logits logits.bin
    python3 scripts/check_hf_export.py model.safetensors logits.bin [--device cuda] [--tol 1e-3]

logits.bin: int32 B=1, T, V; int32 tokens [T]; float32 logits [T, V]. The model is loaded into
transformers' GPT2LMHeadModel when transformers is installed (the real test of the export), else
run by the plain-torch GPT-2 forward below. Exit 0 when max |logit difference| <= tol.
"""
import argparse
import json
import struct
import sys

import torch
import torch.nn.functional as F


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16}
    tensors = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=dtypes[e["dtype"]]).reshape(e["shape"])
        tensors[name.removeprefix("transformer.")] = t.float()
    return tensors, meta


def torch_gpt2(w, n_head, tokens):
    """GPT-2 forward in plain torch from the HF tensors (Conv1D weights are [in, out])."""
    T = tokens.shape[1]
    x = w["wte.weight"][tokens] + w["wpe.weight"][:T]
    C = x.shape[-1]
    ln = lambda x, p: F.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], 1e-5)
    L = sum(1 for k in w if k.endswith(".ln_1.weight"))
    for i in range(L):
        h = f"h.{i}."
        q, k, v = (ln(x, h + "ln_1") @ w[h + "attn.c_attn.weight"] + w[h + "attn.c_attn.bias"]).split(C, dim=-1)
        q, k, v = (t.view(1, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(1, T, C)
        x = x + y @ w[h + "attn.c_proj.weight"] + w[h + "attn.c_proj.bias"]
        m = F.gelu(ln(x, h + "ln_2") @ w[h + "mlp.c_fc.weight"] + w[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ w[h + "mlp.c_proj.weight"] + w[h + "mlp.c_proj.bias"]
    return ln(x, "ln_f") @ w["wte.weight"].T


def hf_gpt2(path, w, meta, tokens, device):
    from transformers import GPT2Config, GPT2LMHeadModel
    from safetensors.torch import load_file

    V, C = w["wte.weight"].shape
    cfg = GPT2Config(vocab_size=V, n_positions=w["wpe.weight"].shape[0], n_embd=C,
                     n_layer=sum(1 for k in w if k.endswith(".ln_1.weight")), n_head=int(meta["n_head"]),
                     activation_function="gelu_new", resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    model = GPT2LMHeadModel(cfg)
    missing, unexpected = model.load_state_dict(load_file(path), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" and not k.endswith(".attn.bias")
               and not k.endswith(".attn.masked_bias")]
    if missing or unexpected:
        sys.exit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.to(device).eval()
    return model(tokens.to(device)).logits.float().cpu()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("safetensors")
    ap.add_argument("logits")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tol", type=float, default=1e-3)
    args = ap.parse_args()

    with open(args.logits, "rb") as f:
        B, T, V = struct.unpack("<3i", f.read(12))
        tokens = torch.frombuffer(bytearray(f.read(4 * B * T)), dtype=torch.int32).long().view(B, T)
        want = torch.frombuffer(bytearray(f.read(4 * B * T * V)), dtype=torch.float32).view(B, T, V)
    w, meta = read_safetensors(args.safetensors)
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        try:
            got = hf_gpt2(args.safetensors, w, meta, tokens, args.device)
            how = "transformers GPT2LMHeadModel"
        except ImportError:
            dev = {k: t.to(args.device) for k, t in w.items()}
            got = torch_gpt2(dev, int(meta.get("n_head", w["wte.weight"].shape[1] // 64)), tokens.to(args.device)).cpu()
            how = "plain-torch GPT-2"
    diff = (got[..., :V] - want).abs().max().item()
    print(f"{how} on {args.device}: max |logit diff| {diff:.3g} over {T} tokens x {V} (tol {args.tol})")
    return 0 if diff <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
