"""The training state packed into a few buffers per jitted call (``train.pack_state``, ``lmzoo.run.packing``): the
packed call computes bit for bit what the call on the state's own arrays does, every leaf comes back to its place,
and a packed run's checkpoints hold the same state (a resume with packing on or off goes on identically)."""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from lmzoo.train import main as train_main
from lmzoo.record.checkpoints import Checkpointer
from lmzoo.run.loop import Trainer, open_steps, train
from lmzoo.run.packing import StatePacking, choose_packing

from conftest import REPO, run_lmzoo, tiny_config

ONE_LAYER = ["model.n_layers=1", "train.probe_batch=0"]


def mixed_leaves():
    """A state's leaves of several dtypes and shapes: a scalar, an int step, a bool, an empty array; each value
    unique, so a leaf read from another's place shows."""
    shapes = [((3, 4), jnp.float32), ((), jnp.float32), ((), jnp.int32), ((5,), jnp.bfloat16), ((2, 1, 3), jnp.float32),
              ((0,), jnp.float32), ((4,), jnp.bool_), ((2, 2), jnp.int32)]
    leaves, start = [], 1
    for shape, dtype in shapes:
        size = int(np.prod(shape))
        values = np.arange(start, start + size)
        leaves.append(jnp.asarray(values % 2 == 0 if dtype == jnp.bool_ else values.reshape(shape), dtype))
        start += size
    return leaves


def one_device_mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:1]).reshape(1), ("data",))


def test_pack_then_unpack_gives_every_leaf_back_in_its_place():
    leaves = mixed_leaves()
    mesh = one_device_mesh()
    packing = StatePacking(leaves, [NamedSharding(mesh, P())] * len(leaves), mesh)
    packed = jax.jit(packing.pack)(leaves)
    assert packing.count == len(packed) == 4  # float32, int32, bfloat16, bool: a buffer each
    assert [x.ndim for x in packed] == [1, 1, 1, 1]
    back = jax.jit(packing.unpack)(packed)
    assert len(back) == len(leaves)
    for original, returned in zip(leaves, back):
        assert returned.shape == original.shape and returned.dtype == original.dtype
        np.testing.assert_array_equal(np.asarray(returned), np.asarray(original))


def test_unpack_reads_each_leaf_from_its_own_offset():
    """The float32 buffer holds the leaves end to end in their order: unpack reads them from those offsets."""
    leaves = mixed_leaves()
    mesh = one_device_mesh()
    packing = StatePacking(leaves, [NamedSharding(mesh, P())] * len(leaves), mesh)
    floats = np.asarray(packing.pack(leaves)[0])
    expected = np.concatenate([np.asarray(leaves[i]).ravel() for i in (0, 1, 4, 5)])
    np.testing.assert_array_equal(floats, expected)
    reversed_floats = [jnp.asarray(floats[::-1].copy()), *packing.pack(leaves)[1:]]
    np.testing.assert_array_equal(np.asarray(packing.unpack(reversed_floats)[1]), floats[-13])  # the scalar's offset


def test_a_leading_axis_stays_in_front_of_every_buffer():
    """Leaves stacked [n, ...] (seeds) pack into [n, total] buffers and come back stacked."""
    leaves = [jnp.stack([x, x]) for x in mixed_leaves()]
    mesh = one_device_mesh()
    packing = StatePacking(leaves, [NamedSharding(mesh, P())] * len(leaves), mesh, lead=1)
    packed = packing.pack(leaves)
    assert all(x.shape[0] == 2 and x.ndim == 2 for x in packed)
    for original, returned in zip(leaves, packing.unpack(packed)):
        np.testing.assert_array_equal(np.asarray(returned), np.asarray(original))


def test_a_step_that_changes_a_leaf_is_refused_when_traced():
    leaves = mixed_leaves()
    mesh = one_device_mesh()
    packing = StatePacking(leaves, [NamedSharding(mesh, P())] * len(leaves), mesh)
    with pytest.raises(TypeError, match="changed shape or dtype"):
        packing.pack([leaves[0].astype(jnp.bfloat16), *leaves[1:]])


def test_leaves_split_over_devices_stay_arrays_of_their_own():
    """A leaf that does not lie whole on every device keeps its own layout (checked on sharding objects alone)."""

    class Split:
        is_fully_replicated = False

    leaves = mixed_leaves()
    mesh = one_device_mesh()
    shardings = [NamedSharding(mesh, P())] * len(leaves)
    shardings[0] = Split()
    packing = StatePacking(leaves, shardings, mesh)
    assert packing.loose == [0] and packing.shardings[-1] is shardings[0]
    assert 0 not in packing.places and packing.count == 5


def test_pack_state_false_and_auto_above_the_limit_pack_nothing(monkeypatch):
    leaves = mixed_leaves()
    mesh = one_device_mesh()
    shardings = [NamedSharding(mesh, P())] * len(leaves)
    assert choose_packing("false", leaves, shardings, mesh) is None
    assert choose_packing("auto", leaves, shardings, mesh) is not None
    monkeypatch.setattr("lmzoo.run.packing.AUTO_MAX_BYTES", 16)
    assert choose_packing("auto", leaves, shardings, mesh) is None
    assert choose_packing("true", leaves, shardings, mesh) is not None


@pytest.mark.parametrize("setting, value", [("true", "true"), ("False", "false"), ("auto", "auto")])
def test_pack_state_reads_yaml_booleans(setting, value):
    assert tiny_config("softmax", f"train.pack_state={setting}").train.pack_state == value


def test_a_bad_pack_state_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_main(["+attn=softmax", "train.pack_state=sometimes"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == ("lmzoo: error: train.pack_state='sometimes' is not valid "
                                               "(choose from: auto, true, false)")


def stepped(cfg, calls: int):
    """(leaves, each call's metrics) after ``calls`` of ``Trainer.advance``, on the host."""
    trainer = Trainer(cfg)
    try:
        metrics = [trainer.advance() for _ in range(calls)]
        trainer.settle()
        return jax.device_get(trainer.leaves), jax.device_get(metrics), trainer.arrays.packing
    finally:
        trainer.close()


@pytest.mark.parametrize("variant, options", [
    ("softmax", []),
    ("softmax", ["train.steps_per_call=2"]),
    ("gla", ["train.state_passing=true", "data.seq_len=9", "train.batch_size=4"]),
], ids=["one_step_a_call", "two_steps_a_call", "state_passing"])
def test_the_packed_call_steps_bit_for_bit_as_the_unpacked_one(tmp_path, variant, options):
    runs = {}
    for pack in ("true", "false"):
        cfg = tiny_config(variant, *ONE_LAYER, *options, "train.steps=4", f"train.pack_state={pack}",
                          run_dir=tmp_path / pack)
        runs[pack] = stepped(cfg, 4 // cfg.train.steps_per_call)
    (packed_leaves, packed_metrics, packing), (leaves, metrics, none) = runs["true"], runs["false"]
    assert none is None and packing is not None and packing.count < len(leaves) // 4
    assert len(packed_leaves) == len(leaves)
    for a, b in zip(packed_leaves, leaves):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert jax.tree.structure(packed_metrics) == jax.tree.structure(metrics)
    for a, b in zip(jax.tree.leaves(packed_metrics), jax.tree.leaves(metrics)):
        np.testing.assert_array_equal(a, b)


def test_a_group_of_seeds_packs_when_asked_and_steps_as_unpacked(tmp_path):
    """Two seeds stacked [seeds, ...] and packed into [seeds, n] buffers (train.pack_state=true; auto leaves a
    group unpacked): the group's vmapped call gives each seed the state and metrics of the unpacked group's, to
    float rounding (XLA fuses the vmapped step on buffers otherwise)."""
    runs = {}
    for pack in ("true", "auto"):
        group = open_steps(tiny_config("softmax", *ONE_LAYER, "train.steps=2", "train.seeds=[0,1]",
                                      f"train.pack_state={pack}", run_dir=tmp_path / pack))
        try:
            metrics = [group.advance() for _ in range(2)]
            group.settle()
            runs[pack] = jax.device_get(group.leaves), jax.device_get(metrics), group.arrays.packing
        finally:
            group.close()
    (packed_leaves, packed_metrics, packing), (leaves, metrics, none) = runs["true"], runs["auto"]
    assert none is None and packing is not None and packing.count < len(leaves) // 4
    for a, b in zip(jax.tree.leaves((packed_leaves, packed_metrics)), jax.tree.leaves((leaves, metrics)), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def checkpointed_params(run_dir, step: int, template) -> list:
    checkpointer = Checkpointer(run_dir / "checkpoints")
    try:
        state, _ = checkpointer.restore(step, template)
        return [np.asarray(x) for x in jax.tree.leaves(state)]
    finally:
        checkpointer.close()


@pytest.mark.parametrize("first, then", [("true", "false"), ("false", "true")])
def test_a_run_resumed_with_packing_switched_goes_on_as_the_uninterrupted_one(tmp_path, first, then):
    """A run killed after its step-3 checkpoint (the later checkpoint removed) resumes to the same step-6 state,
    whether the resume packs or not: checkpoints hold the same state pytree either way."""
    options = [*ONE_LAYER, "train.steps=6", "train.checkpoint_every=3", "train.log_every=1", "train.eval_every=3"]
    whole = tmp_path / "whole"
    train(tiny_config("softmax", *options, f"train.pack_state={first}", run_dir=whole))
    broken = tmp_path / "broken"
    shutil.copytree(whole, broken)
    shutil.rmtree(broken / "checkpoints" / "6")
    summary = train(tiny_config("softmax", *options, f"train.pack_state={then}", run_dir=broken))
    assert summary["step"] == 6
    trainer = Trainer(tiny_config("softmax", *options, "train.pack_state=false", "train.steps=9",
                                  run_dir=tmp_path / "template"))
    try:
        template = trainer.state
        for a, b in zip(checkpointed_params(whole, 6, template), checkpointed_params(broken, 6, template)):
            np.testing.assert_array_equal(a, b)
    finally:
        trainer.close()


MESH_SNIPPET = """
import json, sys, tempfile
import jax, numpy as np
from conftest import tiny_config
from lmzoo.run.loop import Trainer

def stepped(pack, mesh):
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(tiny_config("softmax", "model.n_layers=1", "train.probe_batch=0", "train.steps=3",
                                      f"train.pack_state={pack}", *mesh, run_dir=run_dir))
        try:
            for _ in range(3):
                trainer.advance()
            trainer.settle()
            packing = trainer.arrays.packing
            counts = None if packing is None else [len(trainer.leaves), packing.count, len(packing.loose)]
            return [np.asarray(x).tolist() for x in jax.device_get(trainer.leaves)], counts
        finally:
            trainer.close()

results = {}
for name, mesh in {"fsdp_tensor": ["train.mesh.fsdp=2", "train.mesh.tensor=2"], "data": []}.items():
    (packed, counts), (plain, _) = stepped("true", mesh), stepped("false", mesh)
    results[name] = {"counts": counts, "equal": packed == plain}
print(json.dumps({"devices": jax.device_count(), **results}))
"""


@pytest.mark.slow
def test_on_a_mesh_of_four_devices_split_leaves_stay_apart_and_the_steps_are_the_same():
    """Over fsdp x tensor = 2 x 2 simulated devices the split parameters and moments stay arrays of their own and
    the rest packs; over 4 data devices everything packs; either way three packed steps equal unpacked ones."""
    env = {"XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4",
           "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    result = json.loads(run_lmzoo("-c", MESH_SNIPPET, env=env, check=True).stdout.strip().splitlines()[-1])
    assert result["devices"] == 4
    leaves, arrays, loose = result["fsdp_tensor"]["counts"]
    assert 0 < loose < leaves and arrays < leaves  # the split ones apart, the rest in buffers
    assert result["data"]["counts"][2] == 0  # data parallel: every leaf lies whole on each device
    assert result["fsdp_tensor"]["equal"] and result["data"]["equal"]
