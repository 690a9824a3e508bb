"""A run on disk, below both the trainer and the measurer: the run directory and its atomic writes, checkpoints,
opening a trained run, the checks a saved run passes when training resumes it, and experiment trackers.

``directory`` names every file of a run directory and writes them; ``checkpoints`` saves and restores the training
state (Orbax, with digests); ``opening`` opens a trained run for evaluation, generation and export;
``resuming`` are the checks of a saved run a resume makes; ``tracking`` logs to Weights & Biases; ``migrate`` reads
what older lmzoo wrote as today's.
"""
