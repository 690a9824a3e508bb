"""Each arm's estimates and the differences between arms, with intervals that count seeds and text
(``lmzoo.stats.trained_models``)."""

from __future__ import annotations

from lmzoo.measure.comparison.reading import Group, Run
from lmzoo.stats.bootstrap import RESAMPLES, SEED, ratio_of_sums, ratio_to_reference
from lmzoo.stats.trained_models import Comparison, arm_difference, arm_estimate, paired_by_seed_difference

PAIRINGS = ("none", "seed")  # how two arms' runs enter a difference: unpaired, or paired by seed number


def seed_pairs(group: Group, baseline: Group) -> tuple[list[Run], list[Run]] | None:
    """The two arms' evaluated runs in matching order of seed number, where both hold the same two or more seed
    numbers, each once; None otherwise (they cannot be paired)."""
    mine, theirs = ({str(r.seed): r for r in g.evaluated} for g in (group, baseline))
    if (len(mine) != len(group.evaluated) or len(theirs) != len(baseline.evaluated) or set(mine) != set(theirs)
            or len(mine) < 2 or "None" in mine):
        return None
    return [mine[s] for s in sorted(mine)], [theirs[s] for s in sorted(mine)]


def difference(runs: list, bases: list, metric, settings: dict, pairs: bool, scale: float = 1.0) -> Comparison:
    """``arm_difference``, or with ``pairs`` (the runs and bases in matching seed order) the paired-by-seed one."""
    compute = paired_by_seed_difference if pairs else arm_difference
    return compute(runs, bases, metric, scale=scale, **settings)


def unpaired_notes(groups: list[Group], baseline: Group, pair: str) -> list[str]:
    """With ``pair="seed"``, a line per arm whose runs cannot be paired with the baseline's by seed number."""
    if pair != "seed":
        return []
    return [f"arm {g.label} is not paired by seed (its seeds {seed_list(g)}, {baseline.label}'s {seed_list(baseline)}: "
            "pairing needs the same two or more seed numbers in both arms); its differences are unpaired"
            for g in groups if g is not baseline and g.evaluated and seed_pairs(g, baseline) is None]


def seed_list(group: Group) -> str:
    return ", ".join(str(r.seed) for r in group.evaluated)


def bootstrap_settings(runs: list[Run]) -> dict:
    settings = next((r.results["bootstrap"] for r in runs if r.results and "bootstrap" in r.results), {})
    return {"resamples": settings.get("resamples", RESAMPLES), "seed": settings.get("seed", SEED)}


def ratio_blocks(run: Run, length: int) -> tuple | None:
    """(loss@L, count@L, loss@train, count@train): what the ratio to the training length is made of."""
    here, train = run.blocks(length), run.blocks(run.train_len)
    return None if here is None or train is None else (*here, *train)


def arm_bpb(group: Group, settings: dict, length: int | None = None) -> Comparison | None:
    """Bits per byte of the arm at ``length`` (the training length when None)."""
    blocks = [r.blocks(length or r.train_len) for r in group.evaluated]
    if not blocks or None in blocks:
        return None
    return arm_estimate(blocks, ratio_of_sums, scale=group.evaluated[0].bits_per_nat, **settings)


def arm_ratio(group: Group, length: int, settings: dict) -> Comparison | None:
    blocks = [ratio_blocks(r, length) for r in group.evaluated]
    if not blocks or None in blocks:
        return None
    return arm_estimate(blocks, ratio_to_reference, **settings)


def arm_runs(group: Group, baseline: Group, pair: str) -> tuple[list[Run], list[Run], bool]:
    """(the arm's runs, the baseline's, whether they are paired by seed: ``pair="seed"`` and ``seed_pairs``)."""
    pairs = seed_pairs(group, baseline) if pair == "seed" else None
    return (*pairs, True) if pairs else (group.evaluated, baseline.evaluated, False)


def bpb_difference(group: Group, baseline: Group, settings: dict, pair: str = "none") -> Comparison | None:
    """bpb at the training length, ``group`` minus ``baseline``, each the mean over its seeds (paired by seed
    number with ``pair="seed"`` where the arms allow)."""
    runs, bases, paired = arm_runs(group, baseline, pair)
    if not runs or not bases or {r.train_len for r in runs + bases} != {runs[0].train_len}:
        return None
    return difference([r.blocks(r.train_len) for r in runs], [b.blocks(b.train_len) for b in bases], ratio_of_sums,
                      settings, paired, scale=bases[0].bits_per_nat)


def ratio_difference(group: Group, baseline: Group, length: int, settings: dict,
                     pair: str = "none") -> Comparison | None:
    """bpb@length / bpb@train, ``group`` minus ``baseline``."""
    runs, bases, paired = arm_runs(group, baseline, pair)
    mine, theirs = [ratio_blocks(r, length) for r in runs], [ratio_blocks(b, length) for b in bases]
    if not mine or not theirs or None in mine + theirs:
        return None
    return difference(mine, theirs, ratio_to_reference, settings, paired)
