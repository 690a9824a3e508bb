"""DeltaProduct, Comba and Mamba-3 mixers: the knobs the generic protocol tests (which build each
variant as it is) leave out, the heads' ranges, the attention matrices against the op's
mixing, and the one-line config errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mixer_checks import compiled, first_mixer, inputs, step_through, assert_refused_in_one_line

from lmzoo.ops.mamba3 import mamba3



# Settings the YAMLs leave at their defaults (Comba's output_correction=false only drops a subtraction).
KNOBS = [("deltaproduct", "attn.householder_steps=3", "attn.negative_eigenvalues=false", "attn.gate=none"),
         ("mamba3", "attn.rope_fraction=1.0", "attn.n_groups=2", "attn.head_dim=4")]


@pytest.mark.parametrize("config", KNOBS, ids=[c[0] for c in KNOBS])
def test_other_settings_step_equal_forward(config):
    mixer = first_mixer(*config)
    x = inputs(9, seed=3)
    heads = (lambda m, x: m.heads(x)) if config[0] == "deltaproduct" else (lambda m, x: None)
    stepped, forward, heads = compiled(lambda m, x: (step_through(m, x, m.init_state(2, 9))[0], m(x), heads(m, x)),
                                       mixer)(x)
    np.testing.assert_allclose(stepped, forward, rtol=1e-5, atol=1e-5)
    if heads is not None:  # deltaproduct: three steps per token, beta in (0, 1), no gate
        assert heads[1].shape == (2, 9, 4, 3, 8) and float(heads[3].max()) < 1.0 and heads[4] is None


def test_deltaproduct_heads_unit_keys_and_beta_range():
    mixer = first_mixer("deltaproduct")
    q, k, v, beta, log_g = compiled(lambda m, x: m.heads(x), mixer)(inputs(5))
    assert k.shape == (2, 5, 4, 2, 8) and v.shape == (2, 5, 4, 2, 8) and beta.shape == (2, 5, 4, 2)
    np.testing.assert_allclose(jnp.linalg.norm(k, axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(jnp.linalg.norm(q, axis=-1), 1.0, rtol=1e-5)
    assert bool(jnp.all((beta > 0) & (beta < 2.0))) and float(beta.max()) > 1.0  # negative eigenvalues reached
    assert log_g.shape == (2, 5, 4) and bool(jnp.all(log_g < 0))


def test_comba_prediction_key_and_corrected_query():
    mixer = first_mixer("comba")
    q, k, v, p, beta, log_g = compiled(lambda m, x: m.heads(x), mixer)(inputs(5))
    scale = jax.nn.sigmoid(mixer.inner_decay[...])[:, None]
    np.testing.assert_allclose(p, scale * k, rtol=1e-6)
    np.testing.assert_allclose(jnp.linalg.norm(q + mixer.correction[...][:, None] * p, axis=-1), 1.0, rtol=1e-5)
    assert bool(jnp.all(log_g < 0)) and log_g.shape == (2, 5, 4)


@pytest.mark.parametrize("variant", ["deltaproduct"])
def test_attention_matrix_reproduces_the_mixing(variant):
    """deltaproduct's token weights are exact when a token's sub-step values coincide (Comba's
    matrix is the op's ``comba_weights`` itself, checked in test_product_ops)."""
    mixer = first_mixer(variant)
    x = inputs(9, seed=4)

    def both(m, x):
        heads = list(m.heads(x))
        if variant == "deltaproduct":  # every sub-step writes the first one's value
            heads[2] = jnp.broadcast_to(heads[2][:, :, :, :1], heads[2].shape)
        values = heads[2][:, :, :, 0] if variant == "deltaproduct" else heads[2]
        mixed = jnp.einsum("bhts,bshd->bthd", m.mix_weights(*heads), values)
        return mixed, m.mix(*heads)[0]

    mixed, out = compiled(both, mixer)(x)
    np.testing.assert_allclose(mixed, out, rtol=1e-5, atol=1e-6)


def test_mamba3_attention_matrix_reproduces_the_scan():
    mixer = first_mixer("mamba3", "attn.expand=1")  # one SSM head per model head
    x = inputs(9, seed=5)

    def both(m, x):
        xs, dt, a, b, c, lam, theta, _ = m.ssm_inputs(x)
        y, _ = mamba3(xs, dt, a, b, c, lam, theta, method="naive")  # no D: the matrix is the SSM's alone
        return jnp.einsum("bhts,bshp->bthp", m.attention_matrix(x), xs), y

    mixed, y = compiled(both, mixer)(x)
    np.testing.assert_allclose(mixed, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (("deltaproduct", "attn.householder_steps=0"), ["attn.householder_steps=0"]),
        (("deltaproduct", "attn.gate=channel"), ["attn.gate='channel'", "head, none"]),
        (("comba", "attn.method=pallas"), ["attn.method='pallas'", "naive, chunk, parallel"]),
        (("mamba3", "attn.rope_fraction=0.3"), ["attn.rope_fraction=0.3", "0.5, 1.0"]),
    ],
)
def test_bad_settings_fail_with_one_line(overrides, expected, capsys):
    assert_refused_in_one_line(overrides, expected, capsys)


# ----------------------------------------------------------------------------- state-tracking data and judging


def test_state_tracking_labels_are_the_running_products():
    """Parity: the cumulative sum of the bits mod 2; S_3 and S_5: permutation arrays composed step by step."""
    from itertools import permutations

    from lmzoo.data.synthetic import ParityConfig, PermutationConfig, TaskExamples, TaskTokenizer

    parity = TaskExamples(ParityConfig(), seed=0, split=1, length=41, tokenizer=TaskTokenizer(2))(3)
    np.testing.assert_array_equal(parity["targets"], np.cumsum(parity["inputs"]) % 2)
    assert parity["weights"].sum() == 40 and set(np.unique(parity["inputs"])) == {0, 1}
    for degree in (3, 5):
        cfg = PermutationConfig(degree=degree, task_vocab=len(list(permutations(range(degree)))))
        cfg.check()
        row = TaskExamples(cfg, seed=1, split=0, length=30, tokenizer=TaskTokenizer(cfg.task_vocab))(0)
        perms = [np.asarray(p) for p in permutations(range(degree))]
        state = np.arange(degree)
        for x, target in zip(row["inputs"], row["targets"]):
            state = perms[x][state]  # i -> x(s(i)): the earlier product first, then x
            assert np.array_equal(perms[target], state)
    assert len(np.unique(row["inputs"])) > 10  # S_5's 120 elements are drawn, not a few


def test_state_tracking_settings_fail_with_one_line():
    from lmzoo.data.synthetic import ParityConfig, PermutationConfig
    from lmzoo.schema import ConfigError

    with pytest.raises(ConfigError, match="data.task_vocab=64 must be 2"):
        ParityConfig(task_vocab=64).check()
    with pytest.raises(ConfigError, match="data.degree=9 is not valid"):
        PermutationConfig(degree=9).check()
    with pytest.raises(ConfigError, match="data.task_vocab=6 must be 120"):
        PermutationConfig(degree=5).check()


def test_state_tracking_judge_separates_its_outcomes():
    """Evidence where the claim holds, where it fails, and where a control fails: reproduced, not
    reproduced, inconclusive (three seeds per arm)."""
    from lmzoo.experiments.judging import familywise, outcome
    from lmzoo.experiments.state_tracking import CLAIM_ARM, CONTRAST_ARM, Settings, judge

    settings = Settings()

    def evidence(short, claim_long, contrast_long):
        cell = lambda v: {"estimate": v, "lo": v - 0.02, "hi": v + 0.02, "seeds": [3], "uncertainty": "seeds+text"}  # noqa: E731
        arm = lambda s, lo: {"3": cell(s), "32": cell(max(s, lo)), "128": cell(lo)}  # noqa: E731
        return {"accuracy": {CLAIM_ARM: arm(short, claim_long), CONTRAST_ARM: arm(short, contrast_long)}}

    verdict = lambda e: outcome(familywise(judge(e, settings)))[0]  # noqa: E731
    assert verdict(evidence(0.99, 0.98, 0.51)) == "reproduced"
    assert verdict(evidence(0.99, 0.55, 0.52)) == "not reproduced"
    assert verdict(evidence(0.7, 0.98, 0.51)) == "inconclusive"
