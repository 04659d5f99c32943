"""Training throughput and memory of the worker against PyTorch eager, side by side in one run.

For each size (the llama presets, docs/worker.md "Presets"), both sides train the same model —
same shape, vocab, context, batch, threads; AdamW with gradient clipping, fp32 on the CPU — on
random tokens for the same number of timed steps after one untimed step, each in a process of its
own (so each one's peak resident memory is its own):

  trainshard  ts_worker_tool throughput: the worker's own path (Trainer::Load, then Steps; the
              parameters live in the model, no second copy)
  pytorch     the same Llama written here in PyTorch eager (Debian's python3-torch), with
              torch.optim.AdamW and clip_grad_norm_

Figures: tokens per second and ours / PyTorch (target >= 1.0 at the ~20 M preset); the peak
resident memory beyond the process's memory before the model, per parameter, and that peak less
the activations (target <= 20 bytes per parameter at 20 M and 125 M). The activations are measured
too, in a third process: the worker's model alone, one forward and backward pass of the same
batch; its peak beyond the parameters and their gradients is the activations and the pass's
temporaries.

  python3 tests/bench/train_bench.py [--sizes 20m,125m] [--threads 2] [--steps 4]

The last line is one JSON document with every figure and whether each target was met.
"""

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

BUILD_DIR = os.environ.get(
    "TS_BUILD_DIR",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build"))
TOOL = os.path.join(BUILD_DIR, "worker", "ts_worker_tool")

# The presets' shapes (worker/model_config.cc): layers, width, heads, kv heads, SwiGLU width,
# tied head.
PRESETS = {
    "tiny": (2, 64, 4, 2, 176, True),
    "20m": (6, 384, 6, 2, 1024, True),
    "125m": (12, 768, 12, 4, 3072, True),
    "350m": (24, 1024, 16, 8, 3072, True),
    "1b": (16, 2048, 32, 8, 8192, True),
}


def proc_status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def pytorch_side(args):
    """Runs in its own process: the PyTorch eager model, timed like the tool's."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    layers, d, heads, kv, f, tied = PRESETS[args.preset]
    vocab, t = args.vocab, args.context
    torch.set_num_threads(args.threads)
    rss_before = proc_status_bytes("VmRSS")
    # On CUDA, as PyTorch users train there: bf16 autocast (with --bf16), fused attention and
    # the fused AdamW, gradients dropped between steps.
    cuda = args.device == "cuda"
    dev = torch.device("cuda" if cuda else "cpu")
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    class RmsNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            hd = d // heads
            self.hd = hd
            self.q = nn.Linear(d, heads * hd, bias=False)
            self.k = nn.Linear(d, kv * hd, bias=False)
            self.v = nn.Linear(d, kv * hd, bias=False)
            self.o = nn.Linear(heads * hd, d, bias=False)
            self.gate = nn.Linear(d, f, bias=False)
            self.up = nn.Linear(d, f, bias=False)
            self.down = nn.Linear(f, d, bias=False)
            self.n1, self.n2 = RmsNorm(), RmsNorm()

        def forward(self, x, cos, sin, future):
            b, n, _ = x.shape
            h = self.n1(x)
            q = self.q(h).view(b, n, heads, self.hd).transpose(1, 2)
            k = self.k(h).view(b, n, kv, self.hd).transpose(1, 2)
            v = self.v(h).view(b, n, kv, self.hd).transpose(1, 2)

            def rot(z):
                z1, z2 = z[..., :self.hd // 2], z[..., self.hd // 2:]
                return z * cos + torch.cat((-z2, z1), dim=-1) * sin
            q, k = rot(q), rot(k)
            k = k.repeat_interleave(heads // kv, dim=1)
            v = v.repeat_interleave(heads // kv, dim=1)
            if sdpa is not None:
                y = sdpa(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
                y = torch.softmax(s.masked_fill(future, float("-inf")), dim=-1) @ v
            x = x + self.o(y.transpose(1, 2).reshape(b, n, d))
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.layers = nn.ModuleList([Layer() for _ in range(layers)])
            self.norm = RmsNorm()
            self.head = None if tied else nn.Linear(d, vocab, bias=False)

        def forward(self, tokens):
            n = tokens.shape[1]
            hd = d // heads
            inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device=dev).float() / hd))
            ang = torch.outer(torch.arange(n, device=dev).float(), inv)
            ang = torch.cat((ang, ang), dim=-1)
            cos, sin = ang.cos(), ang.sin()
            future = torch.ones(n, n, dtype=torch.bool, device=dev).triu(1)
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x, cos, sin, future)
            x = self.norm(x)
            return x @ self.embed.weight.t() if self.head is None else self.head(x)

    torch.manual_seed(1)
    model = Llama().to(dev)
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-4,
                            betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))
    gen = torch.Generator().manual_seed(7)
    micro = args.micro_batch or args.batch
    step_s, losses = [], []
    for i in range(args.warmup + args.steps):
        batch = torch.randint(0, vocab, (args.batch, t + 1), generator=gen).to(dev)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.monotonic()
        # On the CPU this PyTorch's default (the gradients zeroed in place, as the worker did when
        # it was measured); on CUDA PyTorch 2's (dropped).
        opt.zero_grad(**({"set_to_none": True} if cuda else {}))
        total = torch.zeros((), device=dev)
        for r in range(0, args.batch, micro):
            rows = batch[r:r + micro]
            if cuda and args.bf16:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(rows[:, :-1])
            else:
                logits = model(rows[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), rows[:, 1:].reshape(-1))
            (loss * rows.shape[0] / args.batch).backward()
            total += loss.detach() * rows.shape[0] / args.batch
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        total = float(total)  # waits for the step, as the worker's last loss does
        s = time.monotonic() - t0
        if i >= args.warmup:
            step_s.append(s)
        losses.append(total)
    print(json.dumps({
        "impl": "pytorch", "torch": torch.__version__, "params": params,
        "threads": args.threads, "batch": args.batch, "micro_batch": args.micro_batch,
        "context": t, "steps": args.steps, "step_s": step_s,
        "tokens_per_s": args.batch * t * args.steps / sum(step_s),
        "loss_first": losses[0], "loss_last": losses[-1],
        "rss_before_model": rss_before, "rss_peak": proc_status_bytes("VmHWM"),
        "device": args.device, "bf16": bool(cuda and args.bf16),
        "device_peak_bytes": torch.cuda.max_memory_allocated() if cuda else 0}))


def run(cmd, timeout):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="20m,125m")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=int, default=3600)
    # Internal: run one PyTorch side.
    p.add_argument("--pytorch-side", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--preset", default="20m", help=argparse.SUPPRESS)
    p.add_argument("--micro-batch", type=int, default=0,
                   help="rows per forward and backward pass (0: the whole batch)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help=argparse.SUPPRESS)
    p.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.pytorch_side:
        pytorch_side(args)
        return 0

    rows, ok = [], True
    for size in args.sizes.split(","):
        common = ["--vocab", str(args.vocab), "--context", str(args.context), "--batch",
                  str(args.batch), "--threads", str(args.threads), "--steps", str(args.steps),
                  "--warmup", str(args.warmup), "--micro-batch", str(args.micro_batch)]
        ours = run([TOOL, "throughput", "--preset", size] + common, args.timeout)
        probe = run([TOOL, "throughput", "--preset", size, "--probe-activations"] + common,
                    args.timeout)
        theirs = run([sys.executable, os.path.abspath(__file__), "--pytorch-side", "--preset",
                      size] + common, args.timeout)
        n = ours["params"]
        if n != theirs["params"]:
            raise RuntimeError(f"{size}: {n} parameters here, {theirs['params']} in PyTorch")
        # The activations (and the pass's temporaries): the probe's peak beyond its parameters
        # and their gradients.
        activations = max(0, probe["rss_peak"] - probe["rss_model"] - 4 * n)
        row = {"size": size, "params": n, "micro_batch": args.micro_batch or args.batch,
               "ours_tokens_per_s": ours["tokens_per_s"],
               "pytorch_tokens_per_s": theirs["tokens_per_s"],
               "speed_ratio": ours["tokens_per_s"] / theirs["tokens_per_s"],
               "ours_peak_bytes_per_param": (ours["rss_peak"] - ours["rss_before_model"]) / n,
               "pytorch_peak_bytes_per_param":
                   (theirs["rss_peak"] - theirs["rss_before_model"]) / n,
               "activation_bytes": activations,
               "ours_state_bytes_per_param":
                   (ours["rss_peak"] - ours["rss_before_model"] - activations) / n,
               "ours_rss_peak": ours["rss_peak"], "pytorch_rss_peak": theirs["rss_peak"]}
        row["memory_target_met"] = row["ours_state_bytes_per_param"] <= 20.0
        ok = ok and row["memory_target_met"]
        if size == "20m":
            row["speed_target_met"] = row["speed_ratio"] >= 1.0
            ok = ok and row["speed_target_met"]
        rows.append(row)
        print(f"{size:>5}: {n:>11,} params, batch {args.batch} x {args.context} "
              f"(micro-batch {row['micro_batch']}), {args.threads} threads | tokens/s ours "
              f"{row['ours_tokens_per_s']:7.1f}  PyTorch {row['pytorch_tokens_per_s']:7.1f}  "
              f"ratio {row['speed_ratio']:.3f} | peak bytes/param ours "
              f"{row['ours_peak_bytes_per_param']:.1f} (PyTorch "
              f"{row['pytorch_peak_bytes_per_param']:.1f}) = "
              f"{row['ours_state_bytes_per_param']:.1f} + activations "
              f"{activations / 2**20:.0f} MiB", flush=True)
    print(json.dumps({"bench": "train", "threads": args.threads, "batch": args.batch,
                      "context": args.context, "vocab": args.vocab, "steps": args.steps,
                      "rows": rows, "targets_met": ok}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
