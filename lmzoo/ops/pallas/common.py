"""What the Pallas kernels share: where they run, how they are launched, how inputs are padded.

One kernel source serves every platform. ``platform`` is where the call will run: ``"gpu"``
lowers through Triton, ``"tpu"`` through Mosaic, and ``"cpu"`` runs the same kernel in Pallas
interpret mode (slow but exact, so machines without an accelerator can check the kernels).
``"tpu_interpret"`` runs it on a CPU in Pallas' TPU interpreter, which follows the TPU's execution
model (grid order, memory spaces, compiler parameters). The backend-specific pieces are only the
compiler parameters chosen here:

- GPU (Triton): every block dimension a kernel loads must be a power of two and matmul operands
  at least 16 wide, so the wrappers pad (``pad_axis``); ``num_warps`` / ``num_stages`` tune the launch.
- TPU (Mosaic): the grid runs in order on one core; grid axes are marked parallel so megacore
  chips may split them. Blocks keep the full last two dimensions of every array, which Mosaic
  accepts for any size.

Kernels never carry values across grid steps (Triton runs programs concurrently); recurrences
run as ``lax.fori_loop`` inside one program.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

PLATFORMS = ("cpu", "gpu", "tpu", "tpu_interpret")

# Triton launch settings per kernel name (``num_warps``, ``num_stages``), read when a kernel is
# traced; kernels not named here get ``compiler_params``' defaults. Chosen on an H100 with
# ``scripts/tune_pallas.py`` (see docs/benchmarks.md).
GPU_TUNING: dict[str, dict[str, int]] = {}


def current_platform() -> str:
    """The default backend as one of PLATFORMS (ROCm and CUDA are both "gpu")."""
    backend = jax.default_backend()
    return "gpu" if backend in ("cuda", "rocm", "gpu") else backend


def resolve_platform(platform: str | None) -> str:
    platform = platform or current_platform()
    if platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r} is not one of {PLATFORMS}")
    return platform


def compiler_params(platform: str, grid_rank: int, *, num_warps: int = 4, num_stages: int = 2):
    if platform == "gpu":
        from jax.experimental.pallas import triton as pltriton

        return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    if platform in ("tpu", "tpu_interpret"):
        from jax.experimental.pallas import tpu as pltpu

        return pltpu.CompilerParams(dimension_semantics=("parallel",) * grid_rank)
    return None


def interpret_mode(platform: str):
    """pallas_call's ``interpret``: plain interpretation on a CPU, the TPU interpreter, or compiled."""
    if platform == "tpu_interpret":
        from jax.experimental.pallas import tpu as pltpu

        return pltpu.InterpretParams()
    return platform == "cpu"


def launch(kernel, *, platform: str, grid, in_specs, out_specs, out_shape, name: str, **tuning):
    """``pl.pallas_call`` with the platform's compiler parameters (interpret mode on CPU)."""
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=interpret_mode(platform),
        compiler_params=compiler_params(platform, len(grid), **{**GPU_TUNING.get(name, {}), **tuning}),
        name=name,
    )


def pad_axis(x: jax.Array, axis: int, size: int) -> jax.Array:
    """Zero-pad ``axis`` of x up to ``size``."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, pad)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def feature_width(d: int) -> int:
    """A feature dimension as the kernels hold it: a power of two, at least 16 (Triton's smallest matmul)."""
    return max(16, pl.next_power_of_2(d))


class HeadMajor(NamedTuple):
    """[B, T, H, D] arrays laid out for the chunked kernels: [B*H, T', D'] with T' whole chunks.

    Zero padding of time and features changes nothing in the recurrences: a padded step has zero
    queries, keys, values and log gates."""

    batch: int
    length: int
    heads: int
    padded: int  # T rounded up to whole chunks

    @classmethod
    def of(cls, x, chunk: int) -> "HeadMajor":
        batch, length, heads = x.shape[:3]
        return cls(batch, length, heads, round_up(length, chunk))

    def pack(self, x, width: int) -> jax.Array:
        """[B, T, H, D] -> [BH, T', width]."""
        x = x.transpose(0, 2, 1, 3).reshape(self.batch * self.heads, self.length, -1)
        return pad_axis(pad_axis(x, 1, self.padded), 2, width)

    def unpack(self, x, width: int) -> jax.Array:
        """[BH, T', D'] -> [B, T, H, width]."""
        x = x[:, : self.length, :width]
        return x.reshape(self.batch, self.heads, self.length, width).transpose(0, 2, 1, 3)

    def pack_state(self, s, dk: int, dv: int) -> jax.Array:
        """[B, H, Dk, Dv] -> [BH, dk, dv]."""
        return pad_axis(pad_axis(s.reshape(self.batch * self.heads, *s.shape[2:]), 1, dk), 2, dv)

    def unpack_state(self, s, d_key: int, d_value: int) -> jax.Array:
        """[BH, Dk', Dv'] -> [B, H, d_key, d_value]."""
        return s[:, :d_key, :d_value].reshape(self.batch, self.heads, d_key, d_value)


_EXPORT_TARGETS = {"gpu": "cuda", "tpu": "tpu"}


def lower_for(platform: str, fn, *args):
    """Lower ``fn(*args)`` (arrays or ShapeDtypeStructs) for an accelerator this machine may lack.

    Export runs the Pallas -> Triton / Mosaic lowering without the device, so a kernel that would
    not lower for the GPU or TPU fails here, on any machine. (The final compilation of that IR
    happens on the device.) Returns the exported module's text.
    """
    # Triton kernels are custom calls without export's stability guarantee (named either way by jax version)
    triton_calls = [jax.export.DisabledSafetyCheck.custom_call(name)
                    for name in ("__gpu$xla.gpu.triton", "triton_kernel_call")]
    exported = jax.export.export(jax.jit(fn), platforms=[_EXPORT_TARGETS[platform]], disabled_checks=triton_calls)
    return exported(*args).mlir_module()


def dot(a, b, dtype, contract=((1,), (0,))):
    """a . b contracting the given axes, operands in ``dtype`` and a float32 result."""
    precision = lax.Precision.HIGHEST if dtype == jnp.float32 else None
    return lax.dot_general(
        a.astype(dtype), b.astype(dtype), (contract, ((), ())), precision=precision, preferred_element_type=jnp.float32
    )


AT_B = ((0,), (0,))  # a^T b
A_BT = ((1,), (1,))  # a b^T
