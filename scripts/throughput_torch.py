"""The PyTorch peer of softmax's training throughput: lmzoo's softmax model written in PyTorch, compiled with
torch.compile, timed the way scripts/throughput.py times lmzoo's step, on the same device in the same call.

    python scripts/throughput_torch.py                                   # model=small's shape, T = 2048, 65,536 tokens
    python scripts/throughput_torch.py --lengths 2048,8192 --json torch_gpt.json
    python scripts/throughput_torch.py --d-model 64 --layers 2 --heads 2 --lengths 32 --batch-tokens 64 --steps 2 \\
        --no-compile                                                     # a CPU smoke run

The model is scripts/cpu_step_torch.py's softmax model: embed -> blocks (RMSNorm, attention with RoPE through
``scaled_dot_product_attention`` (causal: flash attention on a GPU), residual; RMSNorm, SwiGLU, residual) ->
RMSNorm -> tied head, the shapes of ``model=small`` by default (d_model 768, 12 layers, 12 heads, SwiGLU width
2048, lmzoo's byte vocabulary of 259). Parameters are float32 and the step computes in bfloat16 under autocast,
as lmzoo's ``model.dtype=bfloat16``; AdamW (fused on a GPU) with lmzoo's settings and global-norm clipping.
``torch.compile`` compiles the loss (forward and backward); the optimizer runs eagerly, as nanoGPT-style scripts
do. The batch holds ``--batch-tokens`` tokens at every length. Reported per length: step milliseconds (the
median of ``--steps`` steps after the compile and two warm-up steps, each synchronised), tokens/s, model TFLOP/s
counted as throughput.py counts softmax's (6 x parameters + 6 x T x d_model per layer), compile seconds (the
first step) and the peak GiB PyTorch's allocator held. It needs torch and nothing of lmzoo or JAX.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from jsonrows import JsonRows

try:
    import torch
except ImportError:
    sys.exit("throughput_torch.py: needs PyTorch (pip install torch); it is the PyTorch side of the comparison")

from cpu_step_torch import LM, optimizer  # noqa: E402  (after the check above: one line, not a traceback)

BYTE_VOCAB = 259  # lmzoo.data.tokenizers.ByteTokenizer.vocab_size, what scripts/throughput.py trains on


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(args, length: int, device: torch.device) -> dict:
    batch = max(1, args.batch_tokens // length)
    torch.manual_seed(0)
    spec = {"variant": "softmax", "d_model": args.d_model, "heads": args.heads, "layers": args.layers,
            "vocab": BYTE_VOCAB}
    model = LM(spec).to(device)
    params = sum(p.numel() for p in model.parameters())
    opt, schedule = optimizer(model, steps=10**6, warmup=1, fused=device.type == "cuda")
    loss_fn = model.loss if args.no_compile else torch.compile(model.loss)
    tokens = torch.randint(0, BYTE_VOCAB, (batch, length + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step() -> float:
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        opt.zero_grad(set_to_none=True)
        synchronize(device)
        return time.perf_counter() - start

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    compile_s = step()  # the first call compiles the loss's forward and backward
    for _ in range(2):
        step()
    seconds = statistics.median(step() for _ in range(args.steps))
    tokens_per_s = batch * length / seconds
    flops_per_token = 6 * params + args.layers * 6 * length * args.d_model
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return {"variant": "torch_gpt" + ("" if args.no_compile else " compiled"), "T": length, "batch": batch,
            "params": params, "step_ms": 1e3 * seconds, "tokens_per_s": tokens_per_s,
            "model_tflops": tokens_per_s * flops_per_token / 1e12, "memory_gib": peak, "compile_s": compile_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--lengths", default="2048")
    parser.add_argument("--batch-tokens", type=int, default=65536, help="tokens per step at every length")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true", help="eager PyTorch (a CPU smoke run)")
    parser.add_argument("--json", help="also write the rows to this JSON file (rewritten after every row)")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}; d_model={args.d_model} layers={args.layers} "
          f"heads={args.heads}, {args.batch_tokens} tokens per step, bfloat16 autocast, "
          f"{'eager' if args.no_compile else 'torch.compile'}")
    rows = JsonRows(args.json, {"device": name, "torch": torch.__version__, "batch_tokens": args.batch_tokens,
                                "d_model": args.d_model, "layers": args.layers, "heads": args.heads})
    print(f"{'variant':<22}{'T':>7}{'batch':>7}{'params':>12}{'step ms':>10}{'tokens/s':>12}{'TFLOP/s':>9}"
          f"{'GiB':>7}{'compile s':>10}")
    for length in map(int, args.lengths.split(",")):
        try:
            row = rows.add(measure(args, length, device))
        except Exception as error:  # out of memory, a compiler failure: one line, the next length still runs
            print(f"{'torch_gpt':<22}{length:>7}  failed: {str(error).strip().splitlines()[0][:120]}", flush=True)
            continue
        print(f"{row['variant']:<22}{length:>7}{row['batch']:>7}{row['params']:>12,}{row['step_ms']:>10.1f}"
              f"{row['tokens_per_s']:>12,.0f}{row['model_tflops']:>9.2f}{row['memory_gib']:>7.2f}"
              f"{row['compile_s']:>10.1f}", flush=True)
    rows.close()


if __name__ == "__main__":
    main()
