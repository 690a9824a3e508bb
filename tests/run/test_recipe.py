"""The training recipe: Muon and its parameter split, the learning-rate schedules (WSD continued from a
stable-phase checkpoint), and the z-loss. (The tokenizer is in ``test_tokenizer.py``.)"""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from conftest import REPO, VARIANTS, covering_layers, run_lmzoo, tiny_config
from lmzoo.model import LM
from lmzoo.record.directory import RunDir
from lmzoo.run.loop import train
from lmzoo.run.optim import learning_rate_schedule, make_optimizer, muon, optimizer_labels
from lmzoo.run.steps import loss_and_extra, z_loss_term
from lmzoo.schema import ConfigError, OptimConfig
from lmzoo.sharding import EMBED, INNER, VOCAB, param, partitioned
from lmzoo.train import main as train_main

# ----------------------------------------------------------------------------- Muon


def test_muon_steps_along_the_orthogonal_factor_of_the_gradient():
    """The first step on a matrix [24, 40]: -lr * sqrt(40 / 24) * X with X = U S' V^T for the gradient's
    own singular vectors U, V (G = U S V^T) and S' close to 1 (the quintic Newton-Schulz tolerance)."""
    gradient = jax.random.normal(jax.random.key(0), (24, 40)) * jnp.linspace(0.01, 3.0, 40)  # spread singular values
    cfg = OptimConfig(name="muon", muon_lr=0.5, schedule="constant", warmup_steps=0)
    tx, params = muon(cfg, total_steps=10), {"w": jnp.zeros_like(gradient)}
    update, _ = jax.jit(tx.update)({"w": gradient}, tx.init(params), params)
    x = -update["w"] / (0.5 * math.sqrt(40 / 24))
    u, s, vt = np.linalg.svd(np.asarray(gradient, np.float64), full_matrices=False)
    in_gradient_basis = u.T @ np.asarray(x, np.float64) @ vt.T  # diagonal when X shares G's singular vectors
    off_diagonal = in_gradient_basis - np.diag(np.diag(in_gradient_basis))
    assert np.abs(off_diagonal).max() < 1e-4
    singular = np.linalg.svd(np.asarray(x, np.float64), compute_uv=False)
    assert 0.6 < singular.min() and singular.max() < 1.25, singular  # U V^T would give exactly 1
    exact = u @ vt
    assert np.linalg.norm(x - exact) / np.linalg.norm(exact) < 0.3


@pytest.mark.parametrize("variant", VARIANTS)
def test_muon_takes_every_projection_kernel_and_nothing_else(variant):
    """Expected from the modules, not the names: Muon gets the kernel of every dense layer (``nnx.Linear``)
    except the output head; the embedding, norms, gains, biases and filters go to AdamW."""
    cfg = tiny_config(variant, "model.tie_embeddings=false")
    cfg.model.n_layers = covering_layers(variant)
    model = nnx.eval_shape(lambda: LM(cfg, 259, rngs=nnx.Rngs(0)))
    dense_kernels = {(*path, "kernel") for path, node in nnx.iter_graph(model)
                     if isinstance(node, nnx.Linear) and path != ("head",)}
    labels = dict(nnx.to_flat_state(optimizer_labels(nnx.state(model, nnx.Param))))
    muon_params = {path for path, label in labels.items() if label == "muon"}
    assert muon_params == dense_kernels
    assert labels[("embed", "embedding")] == labels[("head", "kernel")] == "adamw"


class Toy(nnx.Module):
    """One parameter of each kind: an embedding, a dense kernel and its bias, a depthwise filter, a gain."""

    def __init__(self, rngs: nnx.Rngs):
        normal = nnx.initializers.normal(1.0)
        self.embed = nnx.Embed(11, 8, embedding_init=partitioned(normal, VOCAB, EMBED), rngs=rngs)
        self.proj = nnx.Linear(8, 6, kernel_init=partitioned(normal, EMBED, INNER),
                               bias_init=partitioned(nnx.initializers.zeros_init(), INNER), rngs=rngs)
        self.filter = param(jnp.ones((4, 6)), None, INNER)
        self.gain = param(jnp.ones((6,)), INNER)


def test_the_adamw_half_of_muon_is_adamw():
    """The parameters Muon does not take get exactly the updates ``optim=adamw`` gives them; the kernel does not."""
    params = nnx.state(Toy(nnx.Rngs(0)), nnx.Param)
    grads = jax.tree.map(lambda p: 1e-2 * jnp.cos(jnp.arange(p.size, dtype=jnp.float32).reshape(p.shape)), params)
    updates = {}
    for name in ("adamw", "muon"):
        tx = make_optimizer(OptimConfig(name=name, warmup_steps=0), 10)
        updates[name] = dict(nnx.to_flat_state(jax.jit(tx.update)(grads, jax.jit(tx.init)(params), params)[0]))
    labels = dict(nnx.to_flat_state(optimizer_labels(params)))
    assert [path for path, label in labels.items() if label == "muon"] == [("proj", "kernel")]
    for path, label in labels.items():
        same = np.array_equal(updates["adamw"][path].get_value(), updates["muon"][path].get_value())
        assert same == (label == "adamw"), path



def test_a_null_grad_clip_leaves_the_gradient_unclipped():
    """With a gradient of global norm 100, clipping to 1 and not clipping give SGD-like first steps 100x apart under
    a constant rate and no Adam scaling (b1 = b2 = 0 with eps large makes Adam's update proportional to g); a
    non-positive clip is still refused in one line."""
    params = {"w": jnp.zeros((4, 25))}
    grads = {"w": jnp.full((4, 25), 10.0)}  # global norm 100
    def first_step(clip):
        cfg = OptimConfig(grad_clip=clip, schedule="constant", warmup_steps=0, b1=0.0, b2=0.0, eps=1e6,
                          weight_decay=0.0)
        tx = make_optimizer(cfg, 10)
        return np.asarray(jax.jit(tx.update)(grads, tx.init(params), params)[0]["w"])
    np.testing.assert_allclose(first_step(None), 100 * first_step(1.0), rtol=1e-5)
    with pytest.raises(ConfigError, match="optim.grad_clip"):
        OptimConfig(grad_clip=0.0).check(10)

SHARDED_SNIPPET = """
import json
import jax, numpy as np
from flax import nnx
from conftest import tiny_config
from lmzoo.model import LM
from lmzoo.run.steps import init_train_state
from lmzoo.sharding import MeshConfig, make_mesh, state_shardings

cfg = tiny_config("softmax", "optim=muon", "optim.warmup_steps=0", "model.n_layers=1", "model.mlp=false")
_, state, tx = init_train_state(cfg, LM(cfg, 259, rngs=nnx.Rngs(0)))
state = {"params": state["params"], "opt": state["opt"]}
keys = jax.random.split(jax.random.key(1), 3)
grads = [jax.tree.map(lambda p: 0.1 * jax.random.normal(key, p.shape), state["params"]) for key in keys]

def step(state, grads):
    updates, opt = tx.update(grads, state["opt"], state["params"])
    return {"params": jax.tree.map(lambda p, u: p + u, state["params"], updates), "opt": opt}

def run(mesh):
    shardings = state_shardings(state, mesh, cfg.train.mesh.rules)
    placed, update = jax.device_put(state, shardings), jax.jit(step, out_shardings=shardings)
    with jax.set_mesh(mesh):
        for g in grads:
            placed = update(placed, jax.device_put(g, shardings["params"]))
    moment = placed["opt"][1].inner_states["muon"].inner_state[0].mu["blocks"][0]["mixer"]["q_proj"]["kernel"]
    moment = moment.get_value()
    params = [np.asarray(x).tolist() for x in jax.tree.leaves(placed["params"])]
    return params, moment.sharding.shard_shape(moment.shape)

one, _ = run(make_mesh(MeshConfig(data=1, fsdp=1, tensor=1), jax.devices()[:1]))
split, moment_shard = run(make_mesh(MeshConfig(data=1, fsdp=4, tensor=2)))
print(json.dumps({"devices": jax.device_count(), "one": one, "split": split, "moment_shard": moment_shard}))
"""


@pytest.mark.slow
def test_muon_on_an_fsdp_and_tensor_mesh_equals_one_device():
    """Three Muon steps with the parameters and their momentum split over fsdp x tensor = 4 x 2 simulated
    devices give the parameters of one device holding everything whole."""
    env = {"XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8",
           "PYTHONPATH": str(REPO / "tests")}
    result = json.loads(run_lmzoo("-c", SHARDED_SNIPPET, env=env, check=True).stdout.strip().splitlines()[-1])
    assert result["devices"] == 8
    assert result["moment_shard"] == [8, 16]  # q_proj [32, 32] (embed, inner) over (fsdp 4, tensor 2)
    for split, one in zip(result["split"], result["one"]):
        np.testing.assert_allclose(split, one, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- schedules


def schedule(total=100, **settings):
    cfg = OptimConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1, **settings)
    return lambda step: float(learning_rate_schedule(cfg, total)(step))


@pytest.mark.parametrize("shape, halfway", [("linear", 0.5), ("cosine", 0.5), ("1-sqrt", 1 - math.sqrt(0.5))])
def test_wsd_warms_up_holds_and_decays_along_its_shape(shape, halfway):
    lr = schedule(schedule="wsd", decay_fraction=0.2, decay_shape=shape)  # decay over steps 80..100
    assert [lr(0), lr(5), lr(10)] == pytest.approx([0.0, 0.5, 1.0])  # warm-up
    assert [lr(11), lr(50), lr(80)] == pytest.approx([1.0, 1.0, 1.0])  # stable, up to the decay's start
    assert lr(90) == pytest.approx(0.1 + 0.9 * halfway)
    assert lr(81) < 1.0 and lr(99) > 0.1 and lr(100) == pytest.approx(0.1)  # the floor at the last step's end
    moved = schedule(schedule="wsd", decay_start=60, decay_shape=shape)
    assert [moved(59), moved(60), moved(80), moved(100)] == pytest.approx([1.0, 1.0, 0.1 + 0.9 * halfway, 0.1])


def test_the_other_schedules():
    cosine, linear, constant = (schedule(schedule=name) for name in ("cosine", "linear", "constant"))
    default = optax.warmup_cosine_decay_schedule(0.0, 1.0, warmup_steps=10, decay_steps=100, end_value=0.1)
    assert [cosine(t) for t in range(101)] == [float(default(t)) for t in range(101)]  # as before the others existed
    assert [linear(5), linear(10), linear(55), linear(100)] == pytest.approx([0.5, 1.0, 0.55, 0.1])
    assert [constant(5), constant(10), constant(100)] == pytest.approx([0.5, 1.0, 1.0])


@pytest.mark.parametrize("setting, message", [
    ("optim.schedule=step", "optim.schedule='step' is not valid (choose from: cosine, wsd, linear, constant)"),
    ("optim.decay_shape=sqrt", "optim.decay_shape='sqrt' is not valid (choose from: linear, cosine, 1-sqrt)"),
    ("optim.decay_start=700", "optim.decay_start=700 must lie in [0, train.steps=600]"),
    ("optim.name=sgd", "optim.name='sgd' is not valid (choose from: adamw, muon)"),
    ("train.z_loss=-1", "train.z_loss=-1.0 must be non-negative"),
])
def test_bad_recipe_settings_fail_in_one_line(capsys, setting, message):
    with pytest.raises(SystemExit) as exit_info:
        train_main(["+attn=softmax", "train.steps=600", setting])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == f"lmzoo: error: {message}"


# ----------------------------------------------------------------------------- z-loss


def test_z_loss_value_and_gradient_match_the_hand_computation():
    logits = jax.random.normal(jax.random.key(1), (2, 3, 7)) * 4.0
    weights = jnp.array([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    coefficient = 1e-2
    lse = np.log(np.exp(np.asarray(logits, np.float64)).sum(-1))  # (2, 3)
    w = np.asarray(weights)
    expected = coefficient * (w * lse**2).sum() / w.sum()
    value, grad = jax.jit(jax.value_and_grad(lambda x: z_loss_term(x, {"weights": weights}, coefficient)))(logits)
    assert float(value) == pytest.approx(expected, rel=1e-6)
    softmax = np.exp(np.asarray(logits, np.float64) - lse[..., None])
    expected_grad = coefficient * 2 * (w * lse)[..., None] * softmax / w.sum()  # d lse / d logits = softmax
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-9)


def test_z_loss_joins_the_objective_and_not_the_loss():
    cfg = tiny_config("softmax", "model.n_layers=1")
    graphdef, params, extra = nnx.split(LM(cfg, 259, rngs=nnx.Rngs(0)), nnx.Param, ...)
    tokens = np.random.default_rng(0).integers(0, 259, (2, 9)).astype(np.int32)
    batch = {"inputs": tokens, "targets": np.roll(tokens, -1, axis=1)}
    objective_of = jax.jit(loss_and_extra, static_argnames="z_loss")
    plain, (plain_metrics, _) = objective_of(params, extra, graphdef, batch)
    objective, (metrics, _) = objective_of(params, extra, graphdef, batch, z_loss=0.5)
    assert "z_loss" not in plain_metrics and metrics["loss"] == plain_metrics["loss"] == plain
    assert float(metrics["z_loss"]) > 0
    assert float(objective) == pytest.approx(float(plain + metrics["z_loss"]), rel=1e-6)


# ----------------------------------------------------------------------------- a run: Muon, WSD continued, z-loss


RECIPE = ["optim=muon", "optim.schedule=wsd", "optim.warmup_steps=1", "train.z_loss=1e-3", "train.grad_accum=2",
          "train.log_every=1", "train.eval_every=100", "train.checkpoint_every=2", "train.probe_batch=0",
          "model.n_layers=1"]


def rows(run_dir) -> list[dict]:
    return [row for row in RunDir(run_dir).read_metrics() if "loss" in row]


@pytest.mark.slow
def test_a_stable_phase_resumed_into_its_decay_is_the_whole_wsd_run(tmp_path):
    """A stable phase (no decay: decay_fraction=0) of 3 steps, resumed with train.steps=6 and
    optim.decay_start=3, trains bit for bit as one 6-step run decaying from step 3 (Muon's state and the
    schedule's count restore exactly; steps accumulate two micro-batches); the resume is recorded; the z-loss
    is logged apart from the loss.
    Resuming with another optimizer is refused before the checkpoints are touched."""
    whole, phased = tmp_path / "whole", tmp_path / "phased"
    train(tiny_config("softmax", *RECIPE, "train.steps=6", "optim.decay_start=3", run_dir=whole))
    train(tiny_config("softmax", *RECIPE, "train.steps=3", "optim.decay_fraction=0", run_dir=phased))
    train(tiny_config("softmax", *RECIPE, "train.steps=6", "optim.decay_fraction=0", "optim.decay_start=3",
                      run_dir=phased))
    assert [r["loss"] for r in rows(phased)] == [r["loss"] for r in rows(whole)]
    assert [r["lr"] for r in rows(phased)] == [r["lr"] for r in rows(whole)]
    lr = [r["lr_muon"] for r in rows(whole)]  # step s updates with the rate at count s - 1
    assert lr[1:4] == pytest.approx([0.02] * 3) and 0.002 < lr[5] < lr[4] < lr[3]  # stable, then decaying
    assert RunDir(phased).read_resumes() == [{"step": 3, "key": "optim.decay_start", "old": None, "new": 3},
                                             {"step": 3, "key": "train.steps", "old": 3, "new": 6}]
    z_losses = [r["z_loss"] for r in rows(whole)]
    assert all(0 < z < 1e-3 * 50 for z in z_losses)  # 1e-3 * logsumexp^2, logsumexp ~ log(259) at the start
    events = b"".join(path.read_bytes() for path in (whole / "tb").glob("events.out.tfevents.*"))
    assert b"z_loss" in events
    with pytest.raises(ConfigError, match="optim.name='adamw': run_dir .* trained with optim.name='muon'"):
        train(tiny_config("softmax", *RECIPE[1:], "train.steps=8", run_dir=phased))  # its state is not AdamW's
    assert RunDir(phased).checkpoints.joinpath("6").exists() and not RunDir(phased).damaged_checkpoints.exists()
