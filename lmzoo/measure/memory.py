"""Memory planning for evaluation and decoding: what a compiled forward needs, and what the device can give."""

from __future__ import annotations

import math
import os

import jax

from lmzoo.config import EvalConfig


def compiled_bytes(compiled) -> int:
    """Device memory a compiled computation needs: arguments, outputs and temporaries, as XLA counts them."""
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes)


def memory_budget(eval_cfg: EvalConfig) -> int:
    """Bytes one forward may use: ``eval.memory_budget_gb``, else the device's memory (the host's available
    memory on a CPU)."""
    if eval_cfg.memory_budget_gb is not None:
        return int(eval_cfg.memory_budget_gb * 2**30)
    return device_memory()


def device_memory() -> int:
    """Bytes of the device's memory (the host's available memory on a CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    return host_available_bytes()


def host_available_bytes() -> int:
    """Memory the kernel could give us now (free plus reclaimable caches: /proc/meminfo's MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")  # free pages only: on the safe side


def largest_fitting_length(length: int, need: int, small: int, small_need: int, budget: int) -> int:
    """About the longest length within ``budget``, from the memory at two lengths and its growth between them."""
    growth = math.log(need / small_need) / math.log(length / small) if length > small and need > small_need else 2.0
    return int(small * (budget / small_need) ** (1 / min(max(growth, 1.0), 2.0)))
