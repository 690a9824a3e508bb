"""The endless training batches of a token stream: shuffled windows, or lanes of the stream for state passing.

``train_iterator`` reads every window once per epoch, each epoch a fresh permutation drawn from the seed.
With ``train.state_passing`` the training batches come from ``stream_iterator`` instead: row ``r`` of each
batch is the window right after row ``r``'s window in the batch before (``StreamLanes``), and ``continues``
[rows] says whether it follows on from it, so that a recurrent model can carry each row's state on.

Multi-host data parallelism: batch sizes are always *global*. Every process
builds the same global batch and keeps the contiguous block of rows
``[shard_index * b, (shard_index + 1) * b)`` with ``b = batch_size //
shard_count``, so the global batch (and training) does not depend on the
number of processes, and the blocks line up with a batch axis sharded over
processes in order.
"""

from __future__ import annotations

from typing import Optional

import grain
import numpy as np

from lmzoo.data.base import Batch
from lmzoo.data.token_windows import TokenWindows

# A batch is one numpy gather, so a couple of threads and a short queue keep
# up with the accelerator; grain's defaults (16 threads, 500 batches queued)
# would hold gigabytes for large batches.
READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)


def rows_per_process(batch_size: int, shard_count: int) -> int:
    if batch_size % shard_count:
        raise ValueError(f"batch size {batch_size} is not divisible by the number of data shards {shard_count}")
    return batch_size // shard_count


class ProcessRows:
    """Keeps this process's contiguous block of a global batch of window indices."""

    def __init__(self, shard_index: int, rows: int):
        self.start = shard_index * rows
        self.stop = self.start + rows

    def __call__(self, window_indices: np.ndarray) -> np.ndarray:
        return window_indices[self.start : self.stop]


def train_iterator(
    tokens: np.ndarray,
    seq_len: int,
    batch_size: int,
    seed: int,
    shard_index: int = 0,
    shard_count: int = 1,
    eos_id: Optional[int] = None,
) -> grain.DatasetIterator:
    """Endless shuffled batches of ``int32[batch_size // shard_count, seq_len]`` (with ``eos_id``, also
    their ``segment_ids``).

    Every epoch is a fresh permutation of the windows (derived from ``seed``);
    a batch may straddle two epochs. The iterator's ``get_state()`` /
    ``set_state()`` resume exactly.
    """
    windows = TokenWindows(tokens, seq_len, eos_id)
    if len(windows) < batch_size:
        raise ValueError(
            f"the training split has {len(windows)} windows of data.seq_len={seq_len}, "
            f"fewer than train.batch_size={batch_size}"
        )
    rows = rows_per_process(batch_size, shard_count)
    dataset = (
        grain.MapDataset.range(len(windows))
        .shuffle(seed=seed)
        .repeat()
        .batch(batch_size, drop_remainder=True)
        .map(ProcessRows(shard_index, rows))
        .map(windows)
    )
    return iter(dataset.to_iter_dataset(READ_OPTIONS))


class StreamLanes:
    """Step ``s``'s batch of windows for state passing: row ``r`` reads lane ``r`` of the stream, one window a step.

    The stream's W windows make ``batch_size`` lanes of L = W // batch_size consecutive windows, lane ``r``
    beginning at window ``offset + r L`` (mod W; ``offset`` drawn from the seed, so that seeds cut the
    stream differently). Step ``s`` reads window ``s mod L`` of every lane: each pass of L steps reads
    L * batch_size windows once, and a lane that runs out wraps to its start. ``continues`` [rows] bool is
    whether a row's window follows on from its window at the step before: False on a lane's first window
    (each pass), on the stream's first (a lane running past the end wraps to it) and, with ``eos_id``,
    after a window that ended with EOS (a new document begins: documents are mixed alone). This process
    keeps its contiguous block of rows, as ``train_iterator`` does.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, shard_index: int = 0,
                 shard_count: int = 1, eos_id: Optional[int] = None):
        self.windows = TokenWindows(tokens, seq_len, eos_id)
        if len(self.windows) < batch_size:
            raise ValueError(f"the training split has {len(self.windows)} windows of data.seq_len={seq_len}, "
                             f"fewer than train.batch_size={batch_size} lanes")
        self.steps_per_pass = len(self.windows) // batch_size
        offset = int(np.random.default_rng(seed).integers(len(self.windows)))
        lanes = (offset + np.arange(batch_size) * self.steps_per_pass) % len(self.windows)
        rows = rows_per_process(batch_size, shard_count)
        self.lane_starts = lanes[shard_index * rows : (shard_index + 1) * rows]

    def __call__(self, step: int) -> Batch:
        """The batch of ``step`` within a pass (0 .. steps_per_pass - 1)."""
        index = (self.lane_starts + step) % len(self.windows)
        batch = self.windows(index)
        batch["continues"] = self.continues(index, step)
        return batch

    def continues(self, index: np.ndarray, step: int) -> np.ndarray:
        follows = (index > 0) & (step > 0)
        eos = self.windows.eos_id
        if eos is not None:  # the input before the window (index 0 reads the stream's last, masked above)
            follows &= self.windows.tokens[index * self.windows.seq_len - 1] != eos
        return follows


def stream_iterator(tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, shard_index: int = 0,
                    shard_count: int = 1, eos_id: Optional[int] = None) -> grain.DatasetIterator:
    """Endless ``StreamLanes`` batches (``inputs``, ``targets``, ``continues`` and with ``eos_id`` ``segment_ids``);
    ``get_state()`` / ``set_state()`` resume exactly, as ``train_iterator``'s do."""
    lanes = StreamLanes(tokens, seq_len, batch_size, seed, shard_index, shard_count, eos_id)
    dataset = grain.MapDataset.range(lanes.steps_per_pass).repeat().map(lanes)
    return iter(dataset.to_iter_dataset(READ_OPTIONS))
