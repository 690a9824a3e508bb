"""Training a run: the loop, the jitted step, the optimizer and its schedule, feeding batches and the metrics log;
the run's record on disk is ``lmzoo.record``."""
