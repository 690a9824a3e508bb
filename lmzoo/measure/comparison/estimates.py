"""Each arm's estimates and the differences between arms, with intervals that count seeds and text
(``lmzoo.stats.trained_models``)."""

from __future__ import annotations

from lmzoo.measure.comparison.reading import Group, Run
from lmzoo.stats.bootstrap import RESAMPLES, SEED, ratio_of_sums, ratio_to_reference
from lmzoo.stats.trained_models import Comparison, arm_difference, arm_estimate


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


def bpb_difference(group: Group, baseline: Group, settings: dict) -> Comparison | None:
    """bpb at the training length, ``group`` minus ``baseline``, each the mean over its seeds."""
    runs, bases = group.evaluated, baseline.evaluated
    if not runs or not bases or {r.train_len for r in runs + bases} != {runs[0].train_len}:
        return None
    return arm_difference([r.blocks(r.train_len) for r in runs], [b.blocks(b.train_len) for b in bases],
                          ratio_of_sums, scale=bases[0].bits_per_nat, **settings)


def ratio_difference(group: Group, baseline: Group, length: int, settings: dict) -> Comparison | None:
    """bpb@length / bpb@train, ``group`` minus ``baseline``."""
    mine = [ratio_blocks(r, length) for r in group.evaluated]
    theirs = [ratio_blocks(b, length) for b in baseline.evaluated]
    if not mine or not theirs or None in mine + theirs:
        return None
    return arm_difference(mine, theirs, ratio_to_reference, **settings)
