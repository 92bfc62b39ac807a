#!/usr/bin/env python3
"""The same byte-level GPT as cohort-engine's model, in PyTorch, timed the
same way: training tokens per second for one member's step.

Prints one JSON line. Needs `pip install torch` (CPU is enough; `--device cuda` times it on the GPU).
"""
import argparse
import json
import math
import time
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, t, d))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, layers, d, h, seq):
        super().__init__()
        self.tok = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(layers))
        self.lnf = nn.LayerNorm(d, eps=1e-5)
        self.head = nn.Linear(d, 256, bias=False)

    def forward(self, x, y):
        t = x.shape[1]
        h = self.tok(x) + self.pos[:t]
        for blk in self.blocks:
            h = blk(h)
        logits = self.head(self.lnf(h))
        return F.cross_entropy(logits.view(-1, 256), y.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--d-model", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = Gpt(a.layers, a.d_model, a.heads, a.seq).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    x = torch.randint(0, 256, (a.batch, a.seq), device=dev)
    y = torch.randint(0, 256, (a.batch, a.seq), device=dev)

    def sync():
        # GPU work is queued: a step is done when the device says so.
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def step(update):
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if update:
            opt.step()
        return loss

    for _ in range(3):
        step(True)
    sync()
    out = {}
    for name, update in (("full", True), ("grad", False)):
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step(update)
        sync()
        dt = (time.perf_counter() - t0) / a.steps
        out[f"step_secs_{name}"] = dt
        out[f"tokens_per_sec_{name}"] = a.batch * a.seq / dt
    out["torch_version"] = torch.__version__
    out["threads"] = torch.get_num_threads()
    out["device"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    out["params"] = sum(p.numel() for p in model.parameters())
    assert math.isfinite(out["tokens_per_sec_full"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
