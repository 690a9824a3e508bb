"""The PyTorch-eager half of ``benchmark_cpu_step.py``: lmzoo's default models written plainly in PyTorch.

Run by the benchmark in an interpreter that has torch (it needs nothing of lmzoo, JAX or this
repository), as a worker speaking JSON lines: its first argument is a JSON spec (variant, shapes,
threads), it answers ``{"params": ...}`` once warmed up, then for each line ``{"steps": n}`` on
stdin one line ``{"fwd": [...], "bwd": [...], "opt": [...]}`` of per-step seconds, and for
``{"components": n}`` the median forward+backward seconds of each part of the model.

The models: embed -> blocks (RMSNorm, mixer, residual; RMSNorm, SwiGLU, residual) -> RMSNorm ->
tied head, float32, cross-entropy, global-norm clipping, AdamW decaying matrices only, warm-up +
cosine learning rate. Mixers: softmax (RoPE, ``scaled_dot_product_attention`` causal), GLA (low-rank
gates, chunked form: a masked matmul within chunks of 64, the state carried between them) and Mamba
(causal depthwise conv, selective scan as a sequential loop over time).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn


def swiglu_width(d_model: int) -> int:
    return -(-int(8 * d_model / 3) // 64) * 64  # lmzoo.model.ff_size


class Softmax(nn.Module):
    def __init__(self, d, heads, **_):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        half = self.head_dim // 2
        self.register_buffer("freqs", 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half), persistent=False)

    def rotate(self, x):  # (B, T, H, D), halves rotated as in lmzoo.positions
        angles = torch.arange(x.shape[1], dtype=torch.float32, device=x.device)[:, None] * self.freqs  # (T, D/2)
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(self, x):
        b, t, d = x.shape
        shape = (b, t, self.heads, self.head_dim)
        q, k = self.rotate(self.q(x).view(shape)), self.rotate(self.k(x).view(shape))
        v = self.v(x).view(shape)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class GLA(nn.Module):
    def __init__(self, d, heads, key_ratio=0.5, gate_rank=16, temperature=16.0, chunk=64, **_):
        super().__init__()
        self.heads, self.dk, self.dv = heads, int(key_ratio * d) // heads, d // heads
        self.temperature, self.chunk = temperature, chunk
        self.q, self.k = nn.Linear(d, heads * self.dk, bias=False), nn.Linear(d, heads * self.dk, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.gate_down, self.gate_up = nn.Linear(d, gate_rank, bias=False), nn.Linear(gate_rank, heads * self.dk)
        self.out_gate, self.head_norm = nn.Linear(d, d, bias=False), nn.RMSNorm(self.dv, eps=1e-5)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        c, n = self.chunk, t // self.chunk
        chunks = lambda y, w: y.view(b, n, c, self.heads, w).transpose(2, 3)  # noqa: E731  (B, N, H, C, w)
        q, k = chunks(self.q(x), self.dk) * self.dk**-0.5, chunks(self.k(x), self.dk)
        v = chunks(self.v(x), self.dv)
        log_g = chunks(F.logsigmoid(self.gate_up(self.gate_down(x))) / self.temperature, self.dk)
        cum = log_g.cumsum(dim=3)  # (B, N, H, C, Dk) log decay from the chunk's start
        q_in, k_in = q * cum.exp(), k * (-cum).exp()  # gates near 1: no overflow within a chunk
        mask = torch.ones(c, c, dtype=torch.bool).tril()
        within = (q_in @ k_in.transpose(-1, -2)).masked_fill(~mask, 0.0) @ v  # (B, N, H, C, Dv)
        k_end = k * (cum[..., -1:, :] - cum).exp()  # each key decayed to the chunk's end
        state, outs = x.new_zeros(b, self.heads, self.dk, self.dv), []
        for i in range(n):
            outs.append(within[:, i] + q_in[:, i] @ state)
            state = cum[:, i, :, -1, :, None].exp() * state + k_end[:, i].transpose(-1, -2) @ v[:, i]
        o = torch.stack(outs, dim=1).transpose(2, 3).reshape(b, t, self.heads, self.dv)
        o = self.head_norm(o).reshape(b, t, d) * F.silu(self.out_gate(x))
        return self.o(o)


class Mamba(nn.Module):
    def __init__(self, d, heads, d_state=16, d_conv=4, expand=2, **_):
        super().__init__()
        e, self.n, self.r = expand * d, d_state, math.ceil(d / 16)
        self.in_proj = nn.Linear(d, 2 * e, bias=False)
        self.conv = nn.Conv1d(e, e, d_conv, groups=e, padding=d_conv - 1)
        self.x_proj = nn.Linear(e, self.r + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.r, e, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(e))
        self.A_log = nn.Parameter(torch.arange(1, d_state + 1, dtype=torch.float32).log().repeat(e))  # flat, as lmzoo's
        self.D = nn.Parameter(torch.ones(e))
        self.out_proj = nn.Linear(e, d, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (B, T, E)
        u = F.silu(self.conv(u.transpose(1, 2))[..., :t].transpose(1, 2))
        dt, B, C = self.x_proj(u).split([self.r, self.n, self.n], dim=-1)
        delta = F.softplus(self.dt_proj(dt) + self.dt_bias)  # (B, T, E)
        A = -self.A_log.exp().view(-1, self.n)  # (E, N)
        decay = (delta[..., None] * A).exp()  # (B, T, E, N)
        drive = (delta * u)[..., None] * B[:, :, None, :]
        h, ys = x.new_zeros(b, A.shape[0], self.n), []
        # unbind: one backward stack, not T scatters
        for decay_t, drive_t, c_t in zip(decay.unbind(1), drive.unbind(1), C.unbind(1)):
            h = decay_t * h + drive_t
            ys.append((h * c_t[:, None, :]).sum(-1))
        y = torch.stack(ys, dim=1) + self.D * u
        return self.out_proj(y * F.silu(z))


MIXERS = {"softmax": Softmax, "gla": GLA, "mamba": Mamba}


class SwiGLU(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, 2 * swiglu_width(d), bias=False), nn.Linear(swiglu_width(d), d, bias=False)

    def forward(self, x):
        gate, value = self.up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * value)


class Block(nn.Module):
    def __init__(self, d, mixer):
        super().__init__()
        self.mixer_norm, self.mixer = nn.RMSNorm(d, eps=1e-6), mixer
        self.mlp_norm, self.mlp = nn.RMSNorm(d, eps=1e-6), SwiGLU(d)

    def forward(self, x):
        x = x + self.mixer(self.mixer_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class LM(nn.Module):
    def __init__(self, spec):
        super().__init__()
        d, mixer = spec["d_model"], MIXERS[spec["variant"]]
        self.embed = nn.Embedding(spec["vocab"], d)
        self.blocks = nn.ModuleList(Block(d, mixer(d, spec["heads"], **spec.get("mixer", {})))
                                    for _ in range(spec["layers"]))
        self.norm = nn.RMSNorm(d, eps=1e-6)
        for p in self.parameters():  # lmzoo's scale; the timing does not depend on it
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def loss(self, inputs, targets):
        h = self.embed(inputs)
        for block in self.blocks:
            h = block(h)
        logits = self.norm(h) @ self.embed.weight.T  # tied head
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def optimizer(model, steps: int, warmup: int = 50, lr: float = 3e-3, fused: bool = False):
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)

    def factor(step):  # linear warm-up, cosine decay to 0.1
        if step < warmup:
            return step / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup))))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def timed_step(model, opt, schedule, batch) -> tuple[float, float, float]:
    """One training step; seconds spent in the forward, the backward and the optimizer."""
    start = time.perf_counter()
    loss = model.loss(*batch)
    forward = time.perf_counter()
    loss.backward()
    backward = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    schedule.step()
    opt.zero_grad(set_to_none=True)
    return forward - start, backward - forward, time.perf_counter() - backward


def component_seconds(model, spec, repeats: int) -> dict:
    """Median forward+backward seconds of each part of the model on inputs of the training shape."""
    b, t, d = spec["batch"], spec["seq_len"], spec["d_model"]
    x = torch.randn(b, t, d, requires_grad=True)
    block = model.blocks[0]
    head = lambda h: F.cross_entropy((model.norm(h) @ model.embed.weight.T).reshape(b * t, -1), targets.reshape(-1))  # noqa: E731
    targets = torch.randint(0, spec["vocab"], (b, t))
    parts = {"mixer": block.mixer, "mlp": block.mlp, "norm": block.mlp_norm, "head+loss": head}
    out = {}
    for name, fn in parts.items():
        cotangent = None if name == "head+loss" else torch.randn(b, t, d)
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            y = fn(x)
            (y if cotangent is None else (y * cotangent).sum()).backward()
            times.append(time.perf_counter() - start)
            x.grad = None
        out[name] = statistics.median(times[1:])
    return out


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    model = LM(spec)
    opt, schedule = optimizer(model, spec["steps"])
    tokens = torch.randint(0, spec["vocab"], (spec["batch"], spec["seq_len"] + 1))
    batch = (tokens[:, :-1], tokens[:, 1:])
    for _ in range(2):  # warm-up: allocator, thread pool
        timed_step(model, opt, schedule, batch)
    reply = lambda obj: print(json.dumps(obj), flush=True)  # noqa: E731
    reply({"params": sum(p.numel() for p in model.parameters()), "torch": torch.__version__,
           "threads": torch.get_num_threads()})
    for line in sys.stdin:
        request = json.loads(line)
        if "steps" in request:
            phases = [timed_step(model, opt, schedule, batch) for _ in range(request["steps"])]
            reply(dict(zip(("fwd", "bwd", "opt"), map(list, zip(*phases)))))
        else:
            reply(component_seconds(model, spec, request["components"]))


if __name__ == "__main__":
    main()
