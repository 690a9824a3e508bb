"""How often intervals between arms call two copies of one experiment different (and find a real difference).

    python scripts/aa_simulation.py [--replicates 2000]

Prints, for 1, 3 and 5 seeds per arm, the share of simulated replicates whose 95% interval of
B - A is significant: with B the same config as A (the false-positive rate, nominal 0.05), and with B
worse by ``--shift`` nats per token (the power). Both the interval lmzoo uses (seeds+text) and the
text-only interval are counted. The simulation is ``lmzoo.metrics.calibration``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from lmzoo.metrics import calibration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=2000)
    parser.add_argument("--resamples", type=int, default=200)
    parser.add_argument("--shift", type=float, default=0.05, help="arm B's real difference, nats per token")
    args = parser.parse_args()
    print(f"{args.replicates} replicates each, {args.resamples} bootstrap resamples, nominal level 0.05")
    print(f"| scenario | seeds per arm | interval | A/A significant [95% MC] | B worse by {args.shift} nats [95% MC] |")
    print("|---|---|---|---|---|")
    for name, scenario in (("default", calibration.DEFAULT), ("text-heavy", calibration.TEXT_HEAVY)):
        for seeds in (1, 3, 5):
            for method_name, method in (("seeds+text", calibration.seeds_and_text), ("text only", calibration.text_only)):
                cells = []
                for shift in (0.0, args.shift):
                    s = replace(scenario, seeds=seeds, shift=shift)
                    rate = calibration.rejection_rate(s, method, replicates=args.replicates, resamples=args.resamples)
                    lo, hi = calibration.wilson(rate * args.replicates, args.replicates)
                    cells.append(f"{rate:.3f} [{lo:.3f}, {hi:.3f}]")
                print(f"| {name} | {seeds} | {method_name} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
