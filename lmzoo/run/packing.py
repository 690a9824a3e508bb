"""The training state's arrays packed into a few flat buffers, so that a jitted call takes and returns few arrays.

JAX's dispatch of a jitted call, and the release of the arrays it donated, cost the host time per array (on a
CPU about 5 us each: 0.5 ms of a call for the ~100 arrays of the default model's state with AdamW), which a
small model's step on an accelerator does not hide. ``StatePacking`` lays the state's leaves end to end in one
1-D buffer per dtype; the jitted call slices and reshapes them out at its start (``unpack``) and concatenates its
new leaves at its end (``pack``), so the call takes and returns a handful of arrays. Slicing, reshaping and
concatenating move values without arithmetic: a run's step computes the same numbers, bit for bit (a vmapped
group of seeds' step may fuse otherwise, and round differently: ``lmzoo.run.seeds``). Leaves split over a
multi-device mesh (FSDP, tensor rules, rows of the carried state) stay arrays of their own: one buffer could not
keep each its own layout. With ``lead`` > 0 the leaves share that many leading axes (e.g. seeds stacked
[seeds, ...]), kept in front of each buffer.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P, Sharding

# train.pack_state=auto packs a state of at most this many bytes. Packing saves the host a fixed time per call
# (dispatching and releasing ~100 arrays: ~0.5 ms), which matters only where a call is that short on the device,
# i.e. for small models; its cost grows with the state: the call writes the whole packed state once more (the
# concatenate) and every read of the state (log rows of the state, validation, checkpoints) copies it out of the
# buffers. 256 MiB is a model of ~20M parameters with AdamW's two moments: its step takes far longer than the
# host's dispatch, so packing a larger state could only cost.
AUTO_MAX_BYTES = 256 * 2**20


class StatePacking:
    """Where each of a list of arrays lies in the packed form: buffers (one per dtype, of the leaves that lie whole
    on every device), then the leaves that do not, each as it is."""

    def __init__(self, leaves: list, shardings: list[Sharding], mesh, lead: int = 0):
        """``leaves``: arrays or ``jax.ShapeDtypeStruct``s; ``shardings``: each leaf's; ``lead``: leading axes every
        leaf shares (kept in front, unpacked)."""
        self.lead = lead
        self.shapes = [tuple(x.shape) for x in leaves]
        self.dtypes = [np.dtype(x.dtype) for x in leaves]
        self.leaf_shardings = list(shardings)
        # A buffer lies whole on every device, so only leaves that lie so themselves join one.
        self.loose = [i for i, s in enumerate(shardings) if not s.is_fully_replicated]
        groups: dict[np.dtype, list[int]] = {}
        for i, dtype in enumerate(self.dtypes):
            if i not in self.loose:
                groups.setdefault(dtype, []).append(i)
        self.groups = list(groups.values())  # leaf indices per buffer, in the leaves' order
        self.places: dict[int, tuple[int, int, int]] = {}  # leaf -> (buffer, offset, size)
        for b, members in enumerate(self.groups):
            offset = 0
            for i in members:
                size = math.prod(self.shapes[i][lead:])
                self.places[i] = (b, offset, size)
                offset += size
        whole = NamedSharding(mesh, P())
        self.shardings = [whole] * len(self.groups) + [shardings[i] for i in self.loose]  # the packed arrays'
        self._pack_fn = self._unpack_fn = None

    @property
    def count(self) -> int:
        """How many arrays the packed form has."""
        return len(self.groups) + len(self.loose)

    def nbytes(self) -> int:
        """The bytes of the leaves that pack into buffers."""
        return sum(math.prod(self.shapes[i]) * self.dtypes[i].itemsize for members in self.groups for i in members)

    def pack(self, leaves: list) -> list:
        """The leaves (in jit, or on the host through ``jax.jit``) as the packed arrays."""
        self.check_fits(leaves)
        flat = lambda x: jnp.reshape(x, (*x.shape[:self.lead], -1))  # noqa: E731
        buffers = [jnp.concatenate([flat(leaves[i]) for i in members], axis=self.lead) for members in self.groups]
        return buffers + [leaves[i] for i in self.loose]

    def unpack(self, packed: list) -> list:
        """The leaves, in their order, from the packed arrays."""
        buffers, loose = packed[:len(self.groups)], packed[len(self.groups):]
        leaves: list = [None] * len(self.shapes)
        for i, (b, offset, size) in self.places.items():
            piece = lax.slice_in_dim(buffers[b], offset, offset + size, axis=self.lead)
            leaves[i] = jnp.reshape(piece, self.shapes[i])
        for i, x in zip(self.loose, loose, strict=True):
            leaves[i] = x
        return leaves

    def packed_on_devices(self, leaves: list) -> list:
        """``pack`` of arrays on the devices, as one jitted call (the packed arrays laid as ``shardings`` says)."""
        if self._pack_fn is None:
            self._pack_fn = jax.jit(self.pack, out_shardings=self.shardings)
        return self._pack_fn(leaves)

    def unpacked_on_devices(self, packed: list) -> list:
        """``unpack`` of arrays on the devices, as one jitted call (each leaf laid as its own sharding says)."""
        if self._unpack_fn is None:
            self._unpack_fn = jax.jit(self.unpack, out_shardings=self.leaf_shardings)
        return self._unpack_fn(packed)

    def check_fits(self, leaves: list) -> None:
        """The leaves are the ones this packing was made for (checked when traced): a step that changed a leaf's
        shape or dtype would otherwise pack it into another leaf's place."""
        found = [(tuple(x.shape), np.dtype(x.dtype)) for x in leaves]
        if found != list(zip(self.shapes, self.dtypes)):
            raise TypeError(f"the state's arrays changed shape or dtype: {found} != "
                            f"{list(zip(self.shapes, self.dtypes))}")


class StateArrays:
    """A state's arrays held as its leaves or packed by ``packing`` (None: as leaves only), each form made from the
    other when read and kept until the state changes: a loop steps the packed form, validations and saves read the
    leaves."""

    def __init__(self, leaves: list | None = None, packing: StatePacking | None = None):
        self.packing, self._leaves, self._packed = packing, leaves, None

    @property
    def leaves(self) -> list | None:
        """The state's arrays, in its pytree's order (each stacked [seeds, ...] for a group's)."""
        if self._leaves is None and self._packed is not None:
            self._leaves = self.packing.unpacked_on_devices(self._packed)
        return self._leaves

    @leaves.setter
    def leaves(self, leaves: list | None) -> None:
        self._leaves, self._packed = leaves, None

    @property
    def packed(self) -> list:
        """The state as a jitted step on it takes and returns it: packed into buffers, or its leaves."""
        if self.packing is None:
            return self.leaves
        if self._packed is None:
            self._packed = self.packing.packed_on_devices(self.leaves)
        return self._packed

    @packed.setter
    def packed(self, packed: list) -> None:
        if self.packing is None:
            self.leaves = packed
        else:
            self._packed, self._leaves = packed, None


def step_on_packed(packing: StatePacking, step, packed: list, *inputs):
    """``step`` (leaves, *inputs) -> (leaves, metrics) on the state packed by ``packing``: unpacked at the call's
    start, its new leaves packed at its end."""
    leaves, metrics = step(packing.unpack(packed), *inputs)
    return packing.pack(leaves), metrics


def choose_packing(setting: str, leaves: list, shardings: list[Sharding], mesh, lead: int = 0) -> StatePacking | None:
    """The packing ``train.pack_state`` asks for (``true``, ``false``, or ``auto``: see ``AUTO_MAX_BYTES``);
    None where the state's arrays are passed as they are (nothing would pack, or packing is off)."""
    if setting == "false":
        return None
    packing = StatePacking(leaves, shardings, mesh, lead)
    if not packing.groups:
        return None
    if setting == "auto" and packing.nbytes() > AUTO_MAX_BYTES:
        return None
    return packing
