"""The worker on a GPU, measured in one run (scripts/gpu-check.sh runs it; docs/benchmarks.md
"GPU"):

  (a) training throughput at bf16 of the ~125 M, ~350 M and ~1 B presets (ts_worker_tool
      throughput --device cuda --bf16): tokens/s and the model-FLOPs utilization
      MFU = 6 · N · tokens/s over the GPU's bf16 peak, against two denominators — the data
      sheet's dense bf16 peak (--peak-tflops) and a plain bf16 matrix product measured in the
      same run (ts_worker_tool matmul);
  (b) the same configurations in PyTorch eager on the same GPU (train_bench.py's PyTorch side:
      bf16 autocast, fused attention, fused AdamW): ours / PyTorch;
  (c) a DiLoCo shard of 4 ts_worker processes sharing the GPU through the worker protocol
      (ts_worker_shard_bench): the loss goes down, one root every round, and the share of the
      wall time in inner steps;
  (d) the tiny preset for 20 steps on the GPU and on the CPU from the same seed and tokens
      (fp32 both): the largest difference of the step losses, against a stated tolerance.

Targets: MFU >= 0.45 at ~1 B; ours / PyTorch >= 1.0 at every preset; inner steps >= 0.9 of the
shard's wall time. Prints a line per figure and one JSON document last.

  python3 tests/bench/gpu_bench.py --build-dir DIR [--sizes 125m,350m,1b] [--quick]
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# fp32 on both, 20 AdamW steps of a 125 k-parameter model: the GPU's kernels sum in other orders
# than the CPU's, so the losses differ by rounding that the steps carry forward, not by more.
TINY_TOLERANCE = 1e-3


def run(cmd, timeout):
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode} after "
                           f"{time.monotonic() - t0:.0f} s:\n{r.stdout[-1500:]}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build-dir", required=True)
    p.add_argument("--sizes", default="125m,350m,1b")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--peak-tflops", type=float, default=989.4,
                   help="the GPU's dense bf16 peak from its data sheet (H100/H200 SXM: 989.4)")
    p.add_argument("--shard-preset", default="125m")
    p.add_argument("--shard-steps", type=int, default=200)
    p.add_argument("--shard-rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="smaller everything, to try the script")
    p.add_argument("--timeout", type=int, default=600)
    args = p.parse_args()
    if args.quick:
        args.steps, args.warmup, args.shard_steps, args.shard_rounds = 3, 1, 20, 2
    tool = os.path.join(args.build_dir, "worker", "ts_worker_tool")
    shard = os.path.join(args.build_dir, "worker", "ts_worker_shard_bench")
    worker = os.path.join(args.build_dir, "worker", "ts_worker")
    out = {"bench": "gpu", "date": time.strftime("%Y-%m-%d"), "rows": []}
    ok = True

    mm = run([tool, "matmul", "--device", "cuda", "--dtype", "bf16", "--n", "8192"], args.timeout)
    out["device_name"] = mm["device_name"]
    out["matmul_bf16_tflops"] = mm["tflops"]
    print(f"GPU {mm['device_name']}: a bf16 8192^3 matrix product runs at {mm['tflops']:.0f} "
          f"TFLOP/s (data sheet {args.peak_tflops:.0f})", flush=True)

    for size in args.sizes.split(","):
        common = ["--vocab", str(args.vocab), "--context", str(args.context), "--batch",
                  str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
                  "--threads", "4"]
        ours = run([tool, "throughput", "--preset", size, "--device", "cuda", "--bf16"] + common,
                   args.timeout)
        theirs = run([sys.executable, os.path.join(HERE, "train_bench.py"), "--pytorch-side",
                      "--preset", size, "--device", "cuda", "--bf16"] + common, args.timeout)
        n = ours["params"]
        flops = 6.0 * n
        row = {"size": size, "params": n, "batch": args.batch, "context": args.context,
               "ours_tokens_per_s": ours["tokens_per_s"],
               "pytorch_tokens_per_s": theirs["tokens_per_s"],
               "ratio": ours["tokens_per_s"] / theirs["tokens_per_s"],
               "mfu_datasheet": flops * ours["tokens_per_s"] / (args.peak_tflops * 1e12),
               "mfu_matmul": flops * ours["tokens_per_s"] / (mm["tflops"] * 1e12),
               "pytorch_mfu_datasheet":
                   flops * theirs["tokens_per_s"] / (args.peak_tflops * 1e12),
               "pytorch_device_peak_bytes": theirs["device_peak_bytes"],
               "torch": theirs["torch"]}
        row["ratio_met"] = row["ratio"] >= 1.0
        ok = ok and row["ratio_met"]
        if size == "1b":
            row["mfu_met"] = row["mfu_datasheet"] >= 0.45
            ok = ok and row["mfu_met"]
        out["rows"].append(row)
        print(f"{size:>5}: {n:>13,} params, {args.batch} x {args.context} tokens a step | "
              f"tokens/s ours {row['ours_tokens_per_s']:9.0f}  PyTorch "
              f"{row['pytorch_tokens_per_s']:9.0f}  ratio {row['ratio']:.3f} | MFU "
              f"{row['mfu_datasheet']:.3f} of the data sheet, {row['mfu_matmul']:.3f} of the "
              f"measured matmul (PyTorch {row['pytorch_mfu_datasheet']:.3f})", flush=True)

    s = run([shard, "--worker", worker, "--workers", "4", "--preset", args.shard_preset,
             "--vocab", str(args.vocab), "--context", "1024", "--batch", "8", "--steps",
             str(args.shard_steps), "--rounds", str(args.shard_rounds), "--device", "cuda",
             "--bf16", "--threads", "2"], args.timeout)
    s["inner_met"] = s["inner_share"] >= 0.9
    ok = ok and s["inner_met"] and s["one_root"] and s["loss_down"]
    out["shard"] = s
    print(f"shard: 4 workers of {args.shard_preset} on one GPU, H = {args.shard_steps}, "
          f"{args.shard_rounds} rounds: eval loss {s['eval_loss_start']:.3f} -> "
          f"{s['eval_loss_end']:.3f}, one root {s['one_root']}, inner steps "
          f"{s['inner_share']:.3f} of the wall time", flush=True)

    tiny = ["throughput", "--preset", "tiny", "--vocab", "512", "--context", "64", "--batch", "8",
            "--steps", "20", "--warmup", "0", "--threads", "4"]
    gpu = run([tool] + tiny + ["--device", "cuda"], args.timeout)
    cpu = run([tool] + tiny + ["--device", "cpu"], args.timeout)
    diff = max(abs(a - b) for a, b in zip(gpu["losses"], cpu["losses"]))
    out["tiny"] = {"gpu_losses": gpu["losses"], "cpu_losses": cpu["losses"], "max_diff": diff,
                   "tolerance": TINY_TOLERANCE, "met": diff <= TINY_TOLERANCE}
    ok = ok and out["tiny"]["met"]
    print(f"tiny, 20 steps fp32: GPU and CPU losses differ by at most {diff:.2e} "
          f"(tolerance {TINY_TOLERANCE:g}); last {gpu['losses'][-1]:.5f} vs "
          f"{cpu['losses'][-1]:.5f}", flush=True)
    out["targets_met"] = ok
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
