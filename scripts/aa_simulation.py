"""How often intervals between arms call two copies of one experiment different (and find a real difference).

    python scripts/aa_simulation.py [--replicates 10000] [--text-only-replicates 2000] [--family-replicates 400]
        [--out docs/aa_simulation.md]

Writes (or prints, without ``--out``) two markdown tables. The first: for each regime of
``lmzoo.stats.calibration.REGIMES`` (3 and 5 seeds per arm, arms of 2 against 5, 5 against 2 and 2 against 2
seeds, each run's own reaction to the text dominating, an arm-wide reaction to each document) and for one seed
per arm, the share of simulated replicates whose 95% interval of B - A is significant: with B the same config as
A (the false-positive rate, nominal 0.05), and with B worse by ``--shift`` nats per token (the power), for the
interval lmzoo uses (seeds+text), the paired-by-seed one (``compare pair=seed``, where both arms hold the same seed
numbers) and the text-only interval. "seeds shared across arms" gives each seed number a shift common to every arm
(the data order a seed sets): 16.5% of the seed variance, as across the frontier arms. The second: for each family of
``calibration.FAMILIES`` (ten arms equal to one baseline), the share of replicates with at least one star after
Holm's adjustment, and without it. Rates carry exact (Clopper-Pearson) 95% intervals of their Monte Carlo error:
at 2000 replicates a true 5% reads anywhere in about [4.1%, 6.0%], so the intervals lmzoo uses get 10000 (±0.4%);
the text-only interval, a bootstrap and far off its rate, needs fewer.
The simulation is ``lmzoo.stats.calibration``; the test suite runs each regime's A/A rate on fewer replicates.
"""

from __future__ import annotations

import argparse
import platform
from dataclasses import replace
from pathlib import Path

import numpy as np
import scipy

from lmzoo.stats import calibration


def rate_cell(rate: float, replicates: int) -> str:
    lo, hi = calibration.clopper_pearson(round(rate * replicates), replicates)
    return f"{rate:.3f} [{lo:.3f}, {hi:.3f}]"


def seeds_of(scenario: calibration.Scenario) -> str:
    return f"{scenario.seeds} vs {scenario.seeds_b}" if scenario.seeds_b else str(scenario.seeds)


def regime_table(replicates: int, text_only_replicates: int, resamples: int, shift: float) -> list[str]:
    lines = [f"| regime | seeds per arm | interval | A/A significant [95% CP] | B worse by {shift} nats [95% CP] |",
             "|---|---|---|---|---|"]
    regimes = {"1 seed": replace(calibration.DEFAULT, seeds=1), **calibration.REGIMES}
    for name, scenario in regimes.items():
        methods = [("seeds+text", calibration.seeds_and_text), ("text only", calibration.text_only)]
        if scenario.seeds_b in (None, scenario.seeds) and scenario.seeds > 1:  # the same seed numbers in both arms
            methods.insert(1, ("paired by seed", calibration.paired_by_seed))
        for method_name, method in methods:
            n = text_only_replicates if method is calibration.text_only else replicates
            cells = [rate_cell(calibration.rejection_rate(replace(scenario, shift=s), method, replicates=n,
                                                          resamples=resamples), n) for s in (0.0, shift)]
            lines.append(f"| {name} | {seeds_of(scenario)} | {method_name} | {cells[0]} | {cells[1]} |")
            print(lines[-1], flush=True)
    return lines


def family_table(replicates: int) -> list[str]:
    lines = [f"| family of {calibration.FAMILY_ARMS} equal arms | baseline vs each arm's seeds | "
             "at least one star, Holm [95% CP] | at least one star, unadjusted [95% CP] |", "|---|---|---|---|"]
    for name, scenario in calibration.FAMILIES.items():
        rates = calibration.family_rejection_rates(scenario, replicates=replicates)
        lines.append(f"| {name} | {seeds_of(scenario)} | {rate_cell(rates['holm'], replicates)} | "
                     f"{rate_cell(rates['none'], replicates)} |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=10000, help="replicates of each cell of lmzoo's intervals")
    parser.add_argument("--text-only-replicates", type=int, default=2000, help="replicates of each text-only cell")
    parser.add_argument("--family-replicates", type=int, default=400)
    parser.add_argument("--resamples", type=int, default=200, help="bootstrap resamples of the text-only interval")
    parser.add_argument("--shift", type=float, default=0.05, help="arm B's real difference, nats per token")
    parser.add_argument("--out", type=Path, help="write the tables here (markdown) as well as printing them")
    args = parser.parse_args()
    head = [f"# The A/A simulation: `python scripts/aa_simulation.py --replicates {args.replicates} "
            f"--text-only-replicates {args.text_only_replicates} --family-replicates {args.family_replicates}"
            + (f" --out {args.out}`" if args.out else "`"), "",
            "Written by the script (`lmzoo.stats.calibration`; numpy "
            f"{np.__version__}, scipy {scipy.__version__}, Python {platform.python_version()}); "
            "docs/measuring.md (\"Calibration: the A/A simulation\") reads it. Nominal level 0.05; "
            "brackets: exact (Clopper-Pearson) 95% intervals of each rate's Monte Carlo error.", "",
            f"Two arms, {args.replicates} replicates a cell ({args.text_only_replicates} for the text-only interval, "
            f"with {args.resamples} bootstrap resamples each):", ""]
    print("\n".join(head), flush=True)
    lines = head + regime_table(args.replicates, args.text_only_replicates, args.resamples, args.shift)
    family_head = ["", f"Ten arms equal to one baseline, {args.family_replicates} replicates a family (seeds+text "
                   "intervals, p-values adjusted over the ten arms):", ""]
    print("\n".join(family_head), flush=True)
    lines += family_head + family_table(args.family_replicates)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
