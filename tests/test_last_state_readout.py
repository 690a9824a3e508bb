"""The last-state readout (MAD's compression): every position's logits come from the last position's state alone,
the task trains through it, and what would read the sequence position by position is refused in one line."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lmzoo.config import ConfigError
from lmzoo.model import LM

from conftest import tiny_config

COMPRESSION = ("data=mad", "data.task=compression", "data.seq_len=6", "data.task_vocab=8")


def test_every_position_is_decoded_from_the_last_state_alone():
    lm = LM(tiny_config("gla", *COMPRESSION), 11, rngs=nnx.Rngs(0))
    h = jax.random.normal(jax.random.key(1), (2, 7, 32))
    cotangent = jax.random.normal(jax.random.key(2), (2, 7, 11))
    grad = jax.grad(lambda h: jnp.sum(lm.logits(lm.readout(h)) * cotangent))(h)
    assert np.abs(np.asarray(grad[:, -1])).min() > 0
    np.testing.assert_array_equal(np.asarray(grad[:, :-1]), 0.0)  # no position reads its own state
    codes = np.asarray(lm.readout(jnp.zeros((1, 7, 32))))
    assert len({row.tobytes() for row in codes[0]}) == 7  # with one state, the position codes tell rows apart


def test_a_language_model_has_no_readout_and_the_readout_changes_no_other_weight():
    plain = LM(tiny_config("softmax"), 11, rngs=nnx.Rngs(0))
    compression = dict(nnx.to_flat_state(nnx.state(LM(tiny_config("softmax", *COMPRESSION), 11, rngs=nnx.Rngs(0)),
                                                    nnx.Param)))
    assert plain.readout is None
    assert {path[0] for path in compression} - {path[0] for path, _ in nnx.to_flat_state(nnx.state(plain))} == \
        {"readout"}
    for path, value in nnx.to_flat_state(nnx.state(plain, nnx.Param)):  # drawn before it: the same draws
        np.testing.assert_array_equal(np.asarray(value.get_value()), np.asarray(compression[path].get_value()))


def test_recurrent_paths_are_refused_in_one_line(capsys):
    lm = LM(tiny_config("gla", *COMPRESSION), 11, rngs=nnx.Rngs(0))
    tokens = jnp.zeros((1, 6), jnp.int32)
    for call in (lambda: lm.prefill(tokens), lambda: lm.carry(tokens), lambda: lm.step(tokens[:, 0], None)):
        with pytest.raises(ConfigError, match="from the last one's state .* no next-token logits to carry or decode"):
            call()
    with pytest.raises(SystemExit) as exit_info:
        tiny_config("gla", *COMPRESSION, "train.state_passing=true")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "lmzoo: error: train.state_passing=true carries each row on position by position, and these data "
        "(data.source=mad) are read out from the last position's state (last_state): train them with "
        "train.state_passing=false")


@pytest.mark.slow
def test_compression_trains_through_the_readout(tmp_path):
    from lmzoo.run.loop import train

    cfg = tiny_config("softmax", *COMPRESSION, "data.seq_len=4", "train.steps=150", "train.eval_every=150",
                      "train.batch_size=32", run_dir=tmp_path)
    summary = train(cfg)
    assert summary["val_loss"] < np.log(7) - 0.3  # below guessing one of the 7 symbols at every position
