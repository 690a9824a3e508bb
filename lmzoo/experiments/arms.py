"""Arms of seeds for the experiments: one run per training seed, compared with ``lmzoo.stats.trained_models``
(training noise and text in one interval; text only, and never significant, with one seed).

``lmzoo.stats.trained_models`` takes each run as block-sum arrays ``[B]`` on blocks shared by every run.
An evaluation gives them (``block_sums``); a per-window measurement of attention rows is one too,
with each window a block: a run's values ``[windows, K]`` become ``K`` sums and ``K`` counts of
one, and a curve statistic of the ``K`` columns is the metric.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from lmzoo.experiments.runs import blocks
from lmzoo.stats.bootstrap import bits_per_nat, ratio_of_sums, ratio_to_reference


def window_run(values: np.ndarray) -> tuple[np.ndarray, ...]:
    """One run's per-window values ``[windows, K]`` as block sums: K columns, then K counts of one."""
    values = np.asarray(values, float)
    return (*values.T, *np.ones_like(values).T)


def curve_metric(statistic: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
    """A metric over ``window_run`` arrays from ``statistic(sums [..., K], counts [..., K])``."""
    def metric(*arrays):
        k = len(arrays) // 2
        return statistic(np.stack(arrays[:k], axis=-1), np.stack(arrays[k:], axis=-1))
    return metric


def column(k: int) -> Callable:
    """The mean over windows of the k-th column."""
    return curve_metric(lambda sums, counts: sums[..., k] / counts[..., k])


def estimate(runs: list, metric: Callable, scale: float = 1.0) -> dict:
    from lmzoo.stats.trained_models import arm_estimate

    return arm_estimate(runs, metric=metric, scale=scale).record()


def difference(runs: list, baselines: list, metric: Callable, scale: float = 1.0) -> dict:
    """Mean over ``runs`` minus mean over ``baselines``: separately trained models, seeds+text."""
    from lmzoo.stats.trained_models import arm_difference

    return arm_difference(runs, baselines, metric=metric, scale=scale).record()


def switch(with_switch: list, without: list, metric: Callable, scale: float = 1.0) -> dict:
    """An evaluation-time switch on the same checkpoints, each checkpoint paired with itself: with two checkpoints
    or more, seeds+text over each checkpoint's effect (how much the effect differs between checkpoints, and the
    text); with one, text only (``lmzoo.stats.trained_models.switch_difference``)."""
    from lmzoo.stats.trained_models import switch_difference

    return switch_difference(with_switch, without, metric=metric, scale=scale).record()


def distinct(results: list[dict]) -> list[dict]:
    """The evaluations of one arm, refused (ValueError, one line) where two are the same run's: the same
    evaluation read twice (a run listed twice, or a link to it) would count one model as two seeds. Two trained
    models never score every block alike, so equal block sums at the training length mean one run."""
    seen: dict[bytes, int] = {}
    for index, result in enumerate(results):
        loss, _ = blocks(result, result["train_seq_len"])
        key = np.asarray(loss, np.float64).tobytes()
        if key in seen:
            raise ValueError(f"runs {seen[key]} and {index} of one arm are the same run (equal block sums): "
                             "one seed counts once; list each seed's run once")
        seen[key] = index
    return results


def bpb_runs(results: list[dict], length: int) -> list[tuple]:
    """(loss, count) block sums at ``length`` of each run's evaluation, each run once."""
    return [blocks(r, length) for r in distinct(results)]


def ratio_runs(results: list[dict], length: int) -> list[tuple]:
    """(loss@length, count@length, loss@T, count@T) of each run, each run once, for ``ratio_to_reference``."""
    return [(*blocks(r, length), *blocks(r, r["train_seq_len"])) for r in distinct(results)]


def bpb_estimate(results: list[dict], length: int) -> dict:
    return estimate(bpb_runs(results, length), ratio_of_sums, bits_per_nat(results[0]))


def ratio_estimate(results: list[dict], length: int) -> dict:
    return estimate(ratio_runs(results, length), ratio_to_reference)


def bpb_difference(results: list[dict], baselines: list[dict], length: int) -> dict:
    return difference(bpb_runs(results, length), bpb_runs(baselines, length), ratio_of_sums, bits_per_nat(results[0]))


def ratio_difference(results: list[dict], baselines: list[dict], length: int) -> dict:
    return difference(ratio_runs(results, length), ratio_runs(baselines, length), ratio_to_reference)
