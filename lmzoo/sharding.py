"""Where parameters, optimizer state and batches live on a mesh of devices.

The mesh (``train.mesh``) has three named axes:

- ``data``:   replicas: each holds whole parameters and takes its own rows of the batch;
- ``fsdp``:   takes its own rows like ``data``, and also holds only a slice of every parameter and
  of its optimizer state (ZeRO-3): XLA gathers a layer's parameters where the layer needs them;
- ``tensor``: splits a layer's own width (attention heads, MLP and mixer channels, the vocabulary)
  so that each device computes on its columns.

Parameters carry logical axis names where they are created (``param`` and ``partitioned`` below,
``lmzoo.mixers.base.dense``): ``EMBED`` (the model width), ``INNER`` (a mixer's own width: heads
times head dimension, expanded channels), ``MLP``, ``VOCAB``, or ``None`` (kept whole: small
vectors, state dimensions, filter taps). One table, ``train.mesh.rules``, maps each name to a mesh
axis. A dimension is split only when its size divides evenly over that axis, and each mesh axis
splits at most one dimension of an array (the first that asks for it); otherwise the dimension
stays whole, which is always correct, only less spread out. The optimizer's moments mirror the
parameters, metadata included, so they are placed by the same names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

import jax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from lmzoo.schema import ConfigError

EMBED, INNER, MLP, VOCAB = "embed", "inner", "mlp", "vocab"
LOGICAL_AXES = (EMBED, INNER, MLP, VOCAB)
MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch's rows are split over both

# Parameters are created on the host and placed afterwards (``state_shardings``), so creating an
# annotated parameter needs no mesh in scope.
nnx.use_eager_sharding(False)


def param(value, *axes) -> nnx.Param:
    """A parameter with a logical axis name (or None) per dimension."""
    if len(axes) != value.ndim:
        raise ValueError(f"{len(axes)} axis names {axes} for a parameter of shape {value.shape}")
    return nnx.Param(value, out_sharding=axes)


def partitioned(init, *axes):
    """An initializer whose parameters carry these logical axis names (for nnx layers' ``*_init``)."""
    return nnx.with_partitioning(init, axes)


@dataclass
class MeshConfig:
    """Devices along each mesh axis; -1 (one axis at most): the devices the others leave."""

    data: int = -1  # devices that each take other batch rows, the whole model on each (-1: those left over)
    fsdp: int = 1  # devices that take other batch rows and split the parameters and optimizer state between them
    tensor: int = 1  # devices that split each layer's matrices (the rules below say which axes)
    rules: Dict[str, Optional[str]] = field(  # logical axis -> mesh axis (or null: kept whole)
        default_factory=lambda: {EMBED: "fsdp", INNER: "tensor", MLP: "tensor", VOCAB: "tensor"})

    def sizes(self, n_devices: int) -> tuple[int, int, int]:
        given = {axis: getattr(self, axis) for axis in MESH_AXES}
        free = [axis for axis, size in given.items() if size == -1]
        for axis, size in given.items():
            if size != -1 and size < 1:
                raise ConfigError(f"train.mesh.{axis}={size} must be a positive number of devices or -1 (the rest)")
        if len(free) > 1:
            raise ConfigError(f"train.mesh: only one axis may be -1, not {' and '.join(free)}")
        fixed = 1
        for axis, size in given.items():
            fixed *= 1 if size == -1 else size
        if free:
            if n_devices % fixed:
                raise ConfigError(f"train.mesh: {n_devices} device(s) do not split into groups of {fixed} "
                                  f"(the product of the fixed axes)")
            given[free[0]] = n_devices // fixed
        elif fixed != n_devices:
            raise ConfigError(f"train.mesh: data x fsdp x tensor = {fixed}, but there are {n_devices} device(s)")
        return tuple(given[axis] for axis in MESH_AXES)

    def check(self) -> None:
        for name, axis in self.rules.items():
            if name not in LOGICAL_AXES:
                raise ConfigError(f"train.mesh.rules.{name}: not a logical axis "
                                  f"(choose from: {', '.join(LOGICAL_AXES)})")
            if axis is not None and axis not in MESH_AXES:
                raise ConfigError(f"train.mesh.rules.{name}={axis!r} is not a mesh axis (choose from: "
                                  f"{', '.join(MESH_AXES)}, or null)")


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
    devices = jax.devices() if devices is None else devices
    return jax.make_mesh(cfg.sizes(len(devices)), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def partition_spec(shape, names, rules: dict, mesh: Mesh) -> P:
    """Logical names -> mesh axes for an array of ``shape``: a dimension is split when its name has
    a mesh axis not yet used by this array that divides it evenly; otherwise it stays whole."""
    used, spec = set(), []
    for size, name in zip(shape, names):
        axis = rules.get(name) if name is not None else None
        if axis is None or axis in used or mesh.shape[axis] == 1 or size % mesh.shape[axis]:
            spec.append(None)
            continue
        used.add(axis)
        spec.append(axis)
    return P(*spec)


def logical_names(variable: nnx.Variable):
    return variable.get_metadata().get("out_sharding")


def state_shardings(state, mesh: Mesh, rules: dict):
    """A NamedSharding for every array of a state pytree (parameters, optimizer state, ...):
    variables by their logical names, anything else (counters, unnamed state) whole on every device."""

    def place(leaf):
        names = logical_names(leaf) if isinstance(leaf, nnx.Variable) else None
        value = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
        spec = P() if names is None else partition_spec(value.shape, names, rules, mesh)
        sharding = NamedSharding(mesh, spec)
        return leaf.replace(value=sharding) if isinstance(leaf, nnx.Variable) else sharding

    return jax.tree.map(place, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows split over ``data`` and ``fsdp``; every other dimension whole."""
    return NamedSharding(mesh, P(BATCH_AXES))


def constrain_rows(x: jax.Array) -> jax.Array:
    """Keep activations [B, ...] split by rows over the batch axes, when traced under a mesh
    (``jax.sharding.use_mesh``); unchanged otherwise. Called at block boundaries, so that GSPMD
    does not carry a parameter's layout into the activations."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(BATCH_AXES) <= set(mesh.axis_names):
        return x
    return jax.lax.with_sharding_constraint(x, P(BATCH_AXES))
