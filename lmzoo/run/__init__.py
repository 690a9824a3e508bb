"""Training a run: the loop, the jitted step, the optimizer, the run directory, checkpoints, the metrics log,
resuming, and opening a trained run."""
