"""The worker's maths against a PyTorch reference, for both model families.

ts_worker_tool writes, for a tiny model and fixed batches, the initial parameters, the
parameters after H inner AdamW steps, the pseudo-gradient, and the parameters and momentum after
one outer Nesterov step. This suite rebuilds the same model in PyTorch (Debian's python3-torch)
from the flat parameter vector, does the same steps with torch.optim.AdamW and torch.optim.SGD,
and compares. It also rebuilds the checkpoint encoding from docs/worker.md byte by byte and
checks its SHA-256 against the root the tool printed.

Tolerances (absolute, elementwise, on fp32): parameters after the inner steps and the
pseudo-gradient within 1e-6 (the inner learning rate is 1e-3, so that is 0.1 % of one step);
parameters after the outer step within 1e-6; the outer momentum buffer and the training losses
within 1e-6. The two sides run the same libtorch kernels: the inner steps and the pseudo-gradient
have come out bit-identical, and the outer step differs by at most 4e-9 (PyTorch's add with alpha
fuses the multiply-add; the worker's outer step deliberately does not). The tolerances leave room
for a few float ulps only.

The llama family is rebuilt here from its formulas (RMSNorm, rotary position embeddings in Hugging
Face's rotate-half form, grouped-query attention, SwiGLU, tied or untied head), not from the
worker's code or any library's Llama: its logits, losses, parameters after the inner steps and the
pseudo-gradient must agree within 1e-5 (fp32 on the CPU).

The export (`trainshard model export`) is read here by a safetensors reader written from the
format's definition (an 8-byte little-endian header length, a JSON header, raw little-endian
buffers) with numpy, checked against the Hugging Face LlamaForCausalLM layout written out here
from config.json alone, loaded by name into the reference Llama, and must give the worker's logits
of the same checkpoint within 1e-5.
"""

import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

BUILD_DIR = os.environ.get(
    "TS_BUILD_DIR",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build"))
TOOL = os.path.join(BUILD_DIR, "worker", "ts_worker_tool")
CLI = os.path.join(BUILD_DIR, "sidecar", "cli", "trainshard")

TOL_INNER = 1e-6
TOL_OUTER = 1e-6
TOL_LLAMA = 1e-5


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.heads = c["heads"]
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        mask = torch.ones(c["context"], c["context"], dtype=torch.bool).tril()
        self.register_buffer("mask", mask)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (y.view(b, t, self.heads, hd).transpose(1, 2) for y in (q, k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, h = c["d_model"], c["d_model"] * c["mlp_ratio"]
        self.fc = nn.Linear(d, h)
        self.proj = nn.Linear(h, d)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1 = nn.LayerNorm(c["d_model"])
        self.attn = Attention(c)
        self.ln2 = nn.LayerNorm(c["d_model"])
        self.mlp = Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab"], c["d_model"])
        self.wpe = nn.Embedding(c["context"], c["d_model"])
        self.blocks = nn.ModuleList([Block(c) for _ in range(c["layers"])])
        self.ln_f = nn.LayerNorm(c["d_model"])

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1])
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return torch.matmul(self.ln_f(x), self.wte.weight.t())  # tied head


class RmsNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, self.heads, self.kv = c["d_model"], c["heads"], c["kv_heads"]
        self.hd = d // self.heads
        self.q_proj = nn.Linear(d, self.heads * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.heads * self.hd, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = self.heads // self.kv  # query head j reads key-value head j // group
        k = k[:, [j // group for j in range(self.heads)]]
        v = v[:, [j // group for j in range(self.heads)]]
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.hd)
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.heads * self.hd))


class LlamaMlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["d_model"], c["mlp_hidden"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = LlamaAttention(c)
        self.mlp = LlamaMlp(c)
        self.input_layernorm = RmsNorm(c["d_model"], c["norm_eps"])
        self.post_attention_layernorm = RmsNorm(c["d_model"], c["norm_eps"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab"], c["d_model"])
        self.layers = nn.ModuleList([LlamaLayer(c) for _ in range(c["layers"])])
        self.norm = RmsNorm(c["d_model"], c["norm_eps"])


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = LlamaBody(c)
        if not c["tie_embeddings"]:
            self.lm_head = nn.Linear(c["d_model"], c["vocab"], bias=False)

    def forward(self, tokens):
        c = self.c
        t = tokens.shape[1]
        hd = c["d_model"] // c["heads"]
        # theta^(-2i/hd) for i < hd/2, each angle used for both halves (rotate-half form).
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))
        angles = torch.outer(torch.arange(t).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos(), angles.sin()
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        if c["tie_embeddings"]:
            return x @ self.model.embed_tokens.weight.t()
        return self.lm_head(x)


def load_flat(model, layout, flat):
    params = dict(model.named_parameters())
    with torch.no_grad():
        for t in layout:
            n = int(np.prod(t["shape"]))
            src = torch.from_numpy(flat[t["offset"]:t["offset"] + n].copy()).view(t["shape"])
            params[t["name"]].copy_(src)


def store_flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def encode_checkpoint(ref, params, momentum):
    """docs/worker.md "Checkpoint encoding", written from the spec."""
    c = ref["config"]
    out = bytearray(b"TSCK")
    if ref["family"] == "gpt":
        out += struct.pack("<I", 1)
        for key in ("layers", "d_model", "heads", "context", "vocab", "mlp_ratio"):
            out += struct.pack("<I", c[key])
    else:
        out += struct.pack("<I", 2) + struct.pack("<I", 2)  # version 2, family llama
        for key in ("layers", "d_model", "heads", "kv_heads", "mlp_hidden", "context", "vocab"):
            out += struct.pack("<I", c[key])
        out += struct.pack("<f", c["rope_theta"]) + struct.pack("<f", c["norm_eps"])
        out += struct.pack("<I", 1 if c["tie_embeddings"] else 0)
    out += struct.pack("<I", 1 if momentum is not None else 0)
    out += struct.pack("<I", len(ref["layout"]))
    for t in ref["layout"]:
        name = t["name"].encode()
        out += struct.pack("<H", len(name)) + name + struct.pack("<B", len(t["shape"]))
        for d in t["shape"]:
            out += struct.pack("<I", d)
    out += params.astype("<f4").tobytes()
    if momentum is not None:
        out += momentum.astype("<f4").tobytes()
    return bytes(out)


def read_safetensors(path):
    """{name: numpy array} from a .safetensors file, read from the format's definition."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert entry["dtype"] == "F32", (name, entry["dtype"])
        begin, end = entry["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype="<f4").reshape(entry["shape"])
    return out


def llama_layout(cfg):
    """LlamaForCausalLM's parameter names and shapes for a config.json, as Hugging Face names
    them."""
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = d // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = {"model.embed_tokens.weight": [v, d], "model.norm.weight": [d]}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": [q, d], p + "self_attn.k_proj.weight": [kv, d],
                    p + "self_attn.v_proj.weight": [kv, d], p + "self_attn.o_proj.weight": [d, q],
                    p + "mlp.gate_proj.weight": [f, d], p + "mlp.up_proj.weight": [f, d],
                    p + "mlp.down_proj.weight": [d, f], p + "input_layernorm.weight": [d],
                    p + "post_attention_layernorm.weight": [d]})
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = [v, d]
    return out


class WorkerReferenceTest(unittest.TestCase):
    def run_case(self, inner_steps, threads, family="gpt", tied=False, extra=()):
        with tempfile.TemporaryDirectory() as out:
            result = subprocess.run(
                [TOOL, "reference", "--out", out, "--inner-steps", str(inner_steps),
                 "--threads", str(threads), "--family", family] + (["--tied"] if tied else []) +
                list(extra),
                capture_output=True, text=True, timeout=120)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(os.path.join(out, "reference.json")) as f:
                ref = json.load(f)
            files = {k: os.path.join(out, v) for k, v in ref["files"].items()}
            arrays = {k: np.load(v) for k, v in files.items() if v.endswith(".npy")}
            with open(files["checkpoint"], "rb") as f:
                checkpoint = f.read()
            exported = None
            if family == "llama":
                exp = os.path.join(out, "exported")
                r = subprocess.run([CLI, "--json", "model", "export", "--checkpoint",
                                    files["checkpoint"], "--out", exp],
                                   capture_output=True, text=True, timeout=120)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(json.loads(r.stdout)["root"], ref["checkpoint_root"])
                with open(os.path.join(exp, "config.json")) as f:
                    cfg = json.load(f)
                exported = (cfg, read_safetensors(os.path.join(exp, "model.safetensors")))
        torch.set_num_threads(threads)
        c, a, o = ref["config"], ref["adamw"], ref["outer"]

        model = Gpt(c) if family == "gpt" else Llama(c)
        tol = TOL_INNER if family == "gpt" else TOL_LLAMA
        names = [n for n, _ in model.named_parameters()]
        self.assertEqual(names, [t["name"] for t in ref["layout"]], "parameter order")
        load_flat(model, ref["layout"], arrays["init"])
        np.testing.assert_array_equal(store_flat(model), arrays["init"])

        def report(what, got, want):
            diff = float(np.max(np.abs(got.astype(np.float64) - want)))
            print(f"  {family} H={inner_steps} threads={threads} {what}: max |diff| = {diff:.3g}")
            return diff

        with torch.no_grad():
            first = torch.from_numpy(arrays["batches"][0])
            logits = model(first[:, :-1]).numpy()
        self.assertLess(report("logits", logits, arrays["logits"]), tol)

        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": a["weight_decay"]},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"])
        inner = ref["inner"]

        def rate(step):
            """The schedule, from its definition: linear warm-up, then a cosine to the floor."""
            warmup, total = inner["warmup_steps"], inner["total_steps"]
            if warmup > 0 and step < warmup:
                return a["lr"] * (step + 1) / warmup
            if total == 0:
                return a["lr"]
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            floor = inner["min_lr_ratio"]
            return a["lr"] * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))

        losses = []
        for s, batch in enumerate(torch.from_numpy(arrays["batches"])):
            opt.zero_grad()
            for group in opt.param_groups:
                group["lr"] = rate(inner["first_step"] + s)
            rows = batch.shape[0]
            micro = inner["micro_batch"] or rows
            total = 0.0
            for start in range(0, rows, micro):
                chunk = batch[start:start + micro]
                share = chunk.shape[0] / rows
                logits = model(chunk[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, c["vocab"]), chunk[:, 1:].reshape(-1))
                (loss * share if share != 1 else loss).backward()
                total += share * loss.item()
            torch.nn.utils.clip_grad_norm_(model.parameters(), a["grad_clip_norm"])
            opt.step()
            losses.append(total)
        local = store_flat(model)
        delta = arrays["init"] - local

        self.assertLess(report("losses", np.array(losses), np.array(ref["losses"])), tol)
        self.assertLess(report("after_inner", local, arrays["after_inner"]), tol)
        self.assertLess(report("delta", delta, arrays["delta"]), tol)

        # The outer step: SGD(momentum, nesterov) with Δ as the gradient, from the tool's
        # momentum buffer, applied to the base parameters.
        theta = torch.from_numpy(arrays["init"].copy()).requires_grad_()
        sgd = torch.optim.SGD([theta], lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"])
        sgd.state[theta]["momentum_buffer"] = torch.from_numpy(arrays["momentum_in"].copy())
        theta.grad = torch.from_numpy(arrays["delta"].copy())
        sgd.step()
        self.assertLess(report("after_outer", theta.detach().numpy(), arrays["after_outer"]),
                        TOL_OUTER)
        self.assertLess(report("momentum_out", sgd.state[theta]["momentum_buffer"].numpy(),
                               arrays["momentum_out"]), TOL_OUTER)

        if exported is not None:
            self.check_export(c, *exported, arrays)

        # The checkpoint bytes follow the documented encoding, and the root is their SHA-256.
        rebuilt = encode_checkpoint(ref, arrays["after_outer"], arrays["momentum_out"])
        self.assertEqual(rebuilt, checkpoint)
        self.assertEqual(hashlib.sha256(checkpoint).hexdigest(), ref["checkpoint_root"])

    def check_export(self, c, cfg, tensors, arrays):
        """The exported checkpoint: config.json describes the model, every tensor is where
        LlamaForCausalLM has it, and loaded by name into the reference it gives the worker's
        logits of the same checkpoint."""
        self.assertEqual(cfg["architectures"], ["LlamaForCausalLM"])
        for key, want in (("hidden_size", c["d_model"]), ("num_hidden_layers", c["layers"]),
                          ("num_attention_heads", c["heads"]),
                          ("num_key_value_heads", c["kv_heads"]),
                          ("intermediate_size", c["mlp_hidden"]), ("vocab_size", c["vocab"]),
                          ("tie_word_embeddings", c["tie_embeddings"])):
            self.assertEqual(cfg[key], want, key)
        self.assertAlmostEqual(cfg["rms_norm_eps"], c["norm_eps"], delta=1e-12)
        self.assertAlmostEqual(cfg["rope_theta"], c["rope_theta"], delta=1e-3)
        self.assertEqual({n: list(t.shape) for n, t in tensors.items()}, llama_layout(cfg))
        model = Llama(c)
        state = {n: torch.from_numpy(t.copy()) for n, t in tensors.items()}
        model.load_state_dict(state, strict=True)
        with torch.no_grad():
            first = torch.from_numpy(arrays["batches"][0])
            logits = model(first[:, :-1]).numpy()
        diff = float(np.max(np.abs(logits.astype(np.float64) - arrays["logits_after_outer"])))
        print(f"  llama export: logits max |diff| = {diff:.3g}")
        self.assertLess(diff, TOL_LLAMA)

    def test_one_inner_step(self):
        self.run_case(inner_steps=1, threads=2)

    def test_several_inner_steps_one_thread(self):
        self.run_case(inner_steps=4, threads=1)

    def test_llama_untied_grouped_query(self):
        self.run_case(inner_steps=3, threads=2, family="llama")

    def test_llama_tied(self):
        self.run_case(inner_steps=2, threads=1, family="llama", tied=True)

    def test_llama_micro_batches_and_schedule(self):
        # Each step's 4 rows as two micro-batches of 2; steps 1..3 of a warm-up of 2 then a
        # cosine to 0.1 at step 6, so the rate rises, peaks and falls within the call.
        self.run_case(inner_steps=3, threads=2, family="llama",
                      extra=("--micro-batch", "2", "--first-step", "1", "--warmup", "2",
                             "--total", "6", "--min-lr-ratio", "0.1"))


if __name__ == "__main__":
    if not os.path.exists(TOOL):
        sys.exit(f"{TOOL} is missing: build ts_worker_tool (GCC builds only)")
    unittest.main(verbosity=2)
