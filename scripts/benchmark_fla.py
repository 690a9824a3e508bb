"""Time flash-linear-attention's Triton ``chunk_gla`` / ``chunk_simple_gla`` and its delta-rule kernels
(``chunk_delta_rule``, ``chunk_gated_delta_rule``; PyTorch) at the shapes ``scripts/benchmark.py
--gpu`` uses, so the Pallas kernels can be compared on the same device.

    pip install torch flash-linear-attention          # a separate environment is fine
    python scripts/benchmark_fla.py                    # rows in benchmark.py's format
    python scripts/benchmark_fla.py --shapes 4x2048x16x128 --json fla.json
    python scripts/benchmark_fla.py --ops chunk_delta_rule,chunk_gated_delta_rule

Inputs mirror benchmark.py's cases: normal q, k, v in bfloat16, gates logsigmoid(normal) / 16 in
float32, layout [B, T, H, D], no initial state; forward returns the output, forward+backward
takes the gradient of <o, random cotangent> w.r.t. q, k, v and g. The delta-rule ops get what lmzoo's
mixers feed theirs: unit keys and beta = sigmoid(normal), and per-head gates for the gated one (the
gradient also w.r.t. beta). Timing: CUDA events around
``repeats`` calls after a warm-up (which also runs Triton's autotuning), median reported.
"""

from __future__ import annotations

import argparse
import statistics

from jsonrows import JsonRows

GPU_SHAPES = "4x2048x16x128,1x8192x32x128,8x1024x16x64"
CHUNK = 64


def chunked_tflops(b, t, h, d, ms, passes):
    """The same FLOP model as benchmark.py's chunked forms (forward work times ``passes``)."""
    return b * h * (4 * t * d * d + 2 * t * CHUNK * d) * passes / ms / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=GPU_SHAPES, help="BxTxHxD list")
    parser.add_argument("--ops", default="chunk_gla,chunk_gated_delta_rule,chunk_delta_rule,chunk_simple_gla",
                        help="which of fla's ops to time")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", help="also write the rows to this JSON file (rewritten after every row)")
    args = parser.parse_args()

    import fla
    import torch
    from fla.ops.delta_rule import chunk_delta_rule
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gla import chunk_gla
    from fla.ops.simple_gla import chunk_simple_gla

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    if not torch.cuda.is_available():
        raise SystemExit("benchmark_fla.py: fla's Triton kernels need a CUDA GPU; none is visible to torch")
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, fla {getattr(fla, '__version__', '?')}")
    print(f"{'op':<28}{'B x T x H x D':>18}{'fwd ms':>10}{'fwd':>11}{'fwd+bwd ms':>12}{'fwd+bwd':>11}{'peak GiB':>10}")
    rows = JsonRows(args.json, {"device": torch.cuda.get_device_name(), "torch": torch.__version__})
    for text in args.shapes.split(","):
        b, t, h, d = map(int, text.split("x"))
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, t, h, d, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        unit_k = torch.nn.functional.normalize(k.detach().float(), dim=-1).to(torch.bfloat16).requires_grad_()
        beta = torch.sigmoid(torch.randn(b, t, h, device=device)).to(torch.bfloat16).requires_grad_()

        def log_gates(shape):
            return (torch.nn.functional.logsigmoid(torch.randn(shape, device=device)) / 16).requires_grad_()

        cases = {  # label -> (call, the inputs its gradient is taken for)
            "chunk_gla": lambda g: (lambda: chunk_gla(q=q, k=k, v=v, g=g, scale=d**-0.5, output_final_state=False)[0],
                                    (q, k, v, g)),
            "chunk_simple_gla": lambda g: (lambda: chunk_simple_gla(q=q, k=k, v=v, g=g, scale=d**-0.5,
                                                                    output_final_state=False)[0], (q, k, v, g)),
            "chunk_delta_rule": lambda g: (lambda: chunk_delta_rule(q=q, k=unit_k, v=v, beta=beta, scale=d**-0.5,
                                                                    output_final_state=False)[0], (q, unit_k, v, beta)),
            "chunk_gated_delta_rule": lambda g: (lambda: chunk_gated_delta_rule(
                q=q, k=unit_k, v=v, g=g, beta=beta, scale=d**-0.5, output_final_state=False)[0],
                (q, unit_k, v, g, beta)),
        }
        gate_shapes = {"chunk_gla": (b, t, h, d)}
        for label in args.ops.split(","):
            name = f"fla/{label}"
            forward, inputs = cases[label](log_gates(gate_shapes.get(label, (b, t, h))))
            cotangent = torch.randn(b, t, h, d, device=device, dtype=torch.bfloat16)

            def both():
                torch.autograd.grad((forward() * cotangent).sum(), inputs)

            try:
                with torch.no_grad():
                    fwd_ms = timed(forward)
                torch.cuda.reset_peak_memory_stats()
                fwd_bwd_ms = timed(both)
            except Exception as error:  # fla refuses some kernels on some Triton versions: say so, time the rest
                print(f"{name:<28}{text:>18}  failed: {str(error).strip().splitlines()[0][:160]}", flush=True)
                continue
            peak = torch.cuda.max_memory_allocated() / 2**30
            row = {"op": name, "B": b, "T": t, "H": h, "D": d, "fwd_ms": fwd_ms, "fwd_bwd_ms": fwd_bwd_ms,
                   "fwd_tflops": chunked_tflops(b, t, h, d, fwd_ms, 1),
                   "fwd_bwd_tflops": chunked_tflops(b, t, h, d, fwd_bwd_ms, 3),
                   "peak_gib": peak}
            rows.add(row)
            print(f"{name:<28}{text:>18}{fwd_ms:>10.2f}{row['fwd_tflops']:>7.1f} TF/s{fwd_bwd_ms:>12.2f}"
                  f"{row['fwd_bwd_tflops']:>7.1f} TF/s{peak:>10.2f}", flush=True)
    rows.close()


if __name__ == "__main__":
    main()
