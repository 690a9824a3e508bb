"""Statistics, NumPy and SciPy only: bootstrap intervals over scored text, intervals between trained models
(seeds and text), the estimate record, the A/A calibration.

A leaf: nothing here imports JAX or another room of lmzoo, so whatever reads numbers (the config's defaults,
compare, the experiments) can use it without the model side.

- ``bootstrap``: confidence intervals of evaluation metrics by a bootstrap over fixed blocks of scored tokens,
  and the layout of ``results.json`` they fill;
- ``trained_models``: intervals between arms of separately trained models that count both training noise
  (the seeds) and the text, and statistics over the seeds of one arm;
- ``uncertainty``: ``Estimate``, the one record of an estimate with its interval and what the interval covers,
  and the adjustment of p-values for several arms;
- ``calibration``: how often those intervals call two copies of one experiment different, on synthetic
  evaluations with a known truth.
"""

from lmzoo.stats.bootstrap import BLOCKS, RESAMPLES, SEED
from lmzoo.stats.uncertainty import LEVEL

__all__ = ["BLOCKS", "LEVEL", "RESAMPLES", "SEED"]
