"""How often intervals between arms call two copies of one experiment different (and find a real difference).

    python scripts/aa_simulation.py [--replicates 2000]

Prints, for each regime of ``lmzoo.stats.calibration.REGIMES`` (3 and 5 seeds per arm, arms of 2 and
5 seeds, each run's own reaction to the text dominating, an arm-wide reaction to each document) and
for one seed per arm, the share of simulated replicates whose 95% interval of B - A is significant:
with B the same config as A (the false-positive rate, nominal 0.05), and with B worse by ``--shift``
nats per token (the power). Both the interval lmzoo uses (seeds+text) and the text-only interval are
counted. The simulation is ``lmzoo.stats.calibration``; the test suite runs each regime's A/A rate
on fewer replicates.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from lmzoo.stats import calibration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=2000)
    parser.add_argument("--resamples", type=int, default=200)
    parser.add_argument("--shift", type=float, default=0.05, help="arm B's real difference, nats per token")
    args = parser.parse_args()
    print(f"{args.replicates} replicates each, {args.resamples} bootstrap resamples, nominal level 0.05")
    print(f"| regime | seeds per arm | interval | A/A significant [95% MC] | B worse by {args.shift} nats [95% MC] |")
    print("|---|---|---|---|---|")
    regimes = {"1 seed": replace(calibration.DEFAULT, seeds=1), **calibration.REGIMES}
    for name, scenario in regimes.items():
        seeds = f"{scenario.seeds} vs {scenario.seeds_b}" if scenario.seeds_b else str(scenario.seeds)
        for method_name, method in (("seeds+text", calibration.seeds_and_text), ("text only", calibration.text_only)):
            cells = []
            for shift in (0.0, args.shift):
                s = replace(scenario, shift=shift)
                rate = calibration.rejection_rate(s, method, replicates=args.replicates, resamples=args.resamples)
                lo, hi = calibration.wilson(rate * args.replicates, args.replicates)
                cells.append(f"{rate:.3f} [{lo:.3f}, {hi:.3f}]")
            print(f"| {name} | {seeds} | {method_name} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
