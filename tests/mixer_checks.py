"""Helpers the mixer tests share: a tiny model of a variant, its first mixer, inputs, compiling."""

from __future__ import annotations

import functools

import jax
import pytest
import jax.numpy as jnp
from flax import nnx

from lmzoo.model import LM

from conftest import tiny_config

VOCAB = 259


def compiled(fn, module):
    """``fn(module, *args)`` as a compiled function of ``*args``."""
    graphdef, state = nnx.split(module)

    @functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
    def run(state, *args):
        return fn(nnx.merge(graphdef, state), *args)

    return lambda *args: run(state, *args)


def build(variant, *overrides, seed=0):
    cfg = tiny_config(variant, *overrides)
    return cfg, LM(cfg, VOCAB, rngs=nnx.Rngs(seed))


def first_mixer(*config):
    return build(*config)[1].blocks[0].mixer


def inputs(length=11, seed=2):
    return jax.random.normal(jax.random.key(seed), (2, length, 32))


def step_through(mixer, x, state):
    """(outputs [B, T, d], final state) of ``mixer.step`` over every position of x, from ``state``."""
    outputs = []
    for t in range(x.shape[1]):
        y_t, state = mixer.step(x[:, t], state)
        outputs.append(y_t)
    return jnp.stack(outputs, axis=1), state


def assert_refused_in_one_line(overrides, expected, capsys):
    """The config of ``overrides`` exits with code 2 and one line of error that names every ``expected`` piece."""
    with pytest.raises(SystemExit) as exit_info:
        tiny_config(*overrides)
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1 and all(e in message for e in expected), message
