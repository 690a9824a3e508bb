"""``python -m lmzoo.experiments``: the listing, one-line errors, and each experiment's quick run."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from omegaconf import OmegaConf

from conftest import REPO
from lmzoo.experiments import MODULES, run_experiment
from lmzoo.experiments import runs
from lmzoo.experiments import sparsity_closed_forms as sparsity
from lmzoo.experiments.judging import SMOKE
from lmzoo.experiments.runs import evaluate_run, train_run
from lmzoo.record.directory import RunDir


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmzoo.experiments", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_listing_names_every_experiment_and_its_claim():
    result = cli()
    assert result.returncode == 0
    for name in MODULES:
        assert name in result.stdout
    assert "arbitrarily sparse" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["no_such_experiment"], "experiment='no_such_experiment' is not valid (choose from: sparsity_closed_forms"),
    (["sparsity_closed_forms", "replicatez=3"], "unknown key 'replicatez'"),
    (["sparsity_closed_forms", "quick=maybe"], "quick='maybe' must be true or false"),
])
def test_bad_settings_fail_in_one_line(args, message):
    result = cli(*args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def gauss_expectation(fn, beta, gamma, points=400_001):
    """E[fn(beta + gamma eps)] by the trapezoid rule on a fine grid (kinks and all), independent of the closed forms."""
    eps = np.linspace(-14.0, 14.0, points)
    density = np.exp(-eps**2 / 2) / math.sqrt(2 * math.pi)
    return float(np.trapezoid(fn(beta + gamma * eps) * density, eps))


@pytest.mark.parametrize("beta, gamma", [(-1.0, 0.5), (0.0, 1.0), (1.0, 0.7), (2.0, 2.5)])
def test_closed_forms_equal_their_integrals(beta, gamma):
    relu2 = lambda x: np.maximum(x, 0) ** 2  # noqa: E731
    for closed, f in ((sparsity.closed_exp, np.exp), (sparsity.closed_relu2, relu2),
                      (sparsity.closed_identity, lambda x: x)):
        want = (gauss_expectation(lambda x: np.abs(f(x)), beta, gamma)
                / math.sqrt(gauss_expectation(lambda x: f(x) ** 2, beta, gamma)))
        assert closed(gamma, beta) == pytest.approx(want, rel=1e-6)
    assert sparsity.closed_relu2_as_published(gamma, beta) == pytest.approx(sparsity.closed_relu2(gamma, beta),
                                                                            rel=1e-9)


def test_decay_closed_form_is_the_sparsity_of_the_decay_vector():
    for lam in (0.5, 0.99):
        for n in (1, 7, 300):
            a = lam ** np.arange(n)
            assert sparsity.closed_decay(n, lam) == pytest.approx(np.abs(a).mean() / np.sqrt((a**2).mean()), rel=1e-9)


@pytest.mark.slow
def test_quick_run_writes_its_verdict_and_figures(tmp_path):
    record = run_experiment("sparsity_closed_forms", tmp_path, quick=True, overrides=["points=3"])
    saved = json.loads((tmp_path / "sparsity_closed_forms" / "verdict.json").read_text())
    assert saved == record
    assert set(saved) >= {"name", "claim", "seed_article", "verdict", "evidence", "figures", "runs", "settings",
                          "seconds"}
    # never a verdict word
    assert saved["verdict"] == SMOKE and saved["quick"] and "not of the claim" in saved["reason"]
    assert saved["seed_article"] == "001" and saved["settings"]["points"] == 3
    assert saved["settings"]["lengths"] == [64, 512]  # quick mode's values
    assert len(saved["figures"]) == len(sparsity.FORMS)
    assert all((tmp_path / "sparsity_closed_forms" / figure).stat().st_size > 0 for figure in saved["figures"])
    checks = {c["name"].split(":")[0]: c for c in saved["checks"]}
    assert set(checks) == {"exp", "relu2", "nonnegative"}  # the decay, identity and iid forms are facts, no checks
    for fact in sparsity.FACTS:  # light tails: every point agrees, even with 8 draws (only a bug could break it)
        assert all(p["agrees"] for p in saved["evidence"][fact]["measurements"] if p["agrees"] is not None)
    assert all(p["agrees"] for p in saved["evidence"]["decay"]["measurements"])  # deterministic: exact


@pytest.mark.slow
def test_decode_cache_quick_run_trains_evaluates_and_reuses_its_runs(tmp_path):
    overrides = ["variants=[gqa,mla]"]
    record = run_experiment("decode_cache", tmp_path, quick=True, overrides=overrides)
    variants = record["evidence"]["variants"]
    assert list(variants) == ["gqa", "mla"] and record["verdict"] == SMOKE
    d_model, layers = 64, 1  # the quick settings: 2 of the 4 heads' keys and values are cached
    assert variants["gqa"]["cache_floats_per_token"] == layers * 2 * (2 * d_model // 4)
    # mla.yaml: a latent of 4 head dims, a RoPE key of half a head
    kv_rank, rope_dim = 4 * d_model // 4, d_model // 4 // 2
    assert variants["mla"]["cache_floats_per_token"] == layers * (kv_rank + rope_dim)  # config arithmetic, not a check
    for v in variants.values():
        assert v["bpb"]["lo"] < v["bpb"]["estimate"] < v["bpb"]["hi"] and v["bpb"]["uncertainty"] == "text"
    difference = record["evidence"]["bpb_differences"]["gqa - mla"]
    assert difference["lo"] <= difference["estimate"] <= difference["hi"] and not difference["significant"]  # 1 seed
    mla_vs_gqa = next(c for c in record["checks"] if c["name"] == "bpb MLA - GQA")
    assert mla_vs_gqa["passed"] is None and mla_vs_gqa["undecided"] == "1 seed: text only"
    assert record["runs"] == ["runs/gqa-s0", "runs/mla-s0"]
    ngrams, scored = record["evidence"]["ngram_bpb"], json.loads((tmp_path / "decode_cache" / "runs" / "gqa-s0" / "eval"
                                                                  / "decode_cache" / "results.json").read_text())
    assert ngrams["scored_digest"] == scored["scored_digest"]  # the n-grams scored on the models' targets
    assert ngrams["unigram"] > ngrams["bigram"] > ngrams["trigram"]
    again = run_experiment("decode_cache", tmp_path, quick=True, overrides=overrides)  # reuses the finished runs
    assert again["evidence"]["variants"] == variants


def test_an_experiment_reuses_a_finished_run_of_the_same_settings_from_another_experiment(tmp_path):
    tiny = ["data.seq_len=32", "train.batch_size=2", "model.n_layers=1", "model.d_model=32", "train.eval_every=2",
            "train.eval_tokens=128", "train.probe_batch=0"]
    first = tmp_path / "one" / "runs" / "softmax-s0"
    train_run("softmax", first, seed=0, steps=2, overrides=tiny)
    twin = tmp_path / "two" / "runs" / "rope-s0"
    train_run("softmax", twin, seed=0, steps=2, overrides=tiny)
    assert twin.is_symlink() and twin.resolve() == first.resolve()
    assert not RunDir(first).resumes_path.exists()  # the finished run is not resumed under another name
    for other_seed_or_steps in [dict(seed=1, steps=2), dict(seed=0, steps=3)]:  # other settings train anew
        fresh = tmp_path / "three" / "runs" / f"softmax-{len(list((tmp_path / 'three').glob('runs/*')))}"
        train_run("softmax", fresh, overrides=tiny, **other_seed_or_steps)
        assert not fresh.is_symlink() and RunDir(fresh).is_trained()


def test_a_finished_evaluation_is_read_back_unless_its_settings_or_checkpoint_changed(tmp_path, monkeypatch):
    tiny = ["data.seq_len=32", "train.batch_size=2", "model.n_layers=1", "model.d_model=32", "train.eval_every=2",
            "train.eval_tokens=128", "train.probe_batch=0"]
    run_dir = tmp_path / "runs" / "softmax-s0"
    train_run("softmax", run_dir, seed=0, steps=2, overrides=tiny)
    first = evaluate_run(run_dir, tag="t", lengths=[32, 64], tokens=256)
    scored = []
    monkeypatch.setattr(runs, "evaluate", lambda *a, **k: scored.append(1) or copy.deepcopy(first))
    assert evaluate_run(run_dir, tag="t", lengths=[32, 64], tokens=256) == first and not scored  # read back
    evaluate_run(run_dir, tag="t", lengths=[32, 64], tokens=128)  # other settings: scored anew
    RunDir(run_dir).write_results("t", {**first, "step": 1})  # made from an older checkpoint
    evaluate_run(run_dir, tag="t", lengths=[32, 64], tokens=256)
    assert len(scored) == 2


def test_entropy_growth_difference_pairs_windows():
    from lmzoo.experiments import logn_entropy
    from lmzoo.experiments.runs import bucket_means

    keys_seen = np.arange(1, 65)
    noise = np.random.default_rng(0).normal(0, 0.01, (6, 64))  # the same windows' text in both conditions
    uniform = np.log(keys_seen) + noise  # entropy of uniform attention: grows with log n
    invariant = np.full(64, 2.0) + noise
    edges = [4, 8, 16, 32, 64]
    assert bucket_means(uniform[:1] * 0 + keys_seen, edges)[0].tolist() == [6.5, 12.5, 24.5, 48.5]
    flat_minus_growing = logn_entropy.growth_difference(invariant, uniform, edges)
    rise = np.log(np.arange(33, 65)).mean() - np.log(np.arange(5, 9)).mean()
    assert flat_minus_growing["ci"][1] < 0 and flat_minus_growing["value"] == pytest.approx(-rise, abs=0.01)
    same = logn_entropy.growth_difference(uniform, uniform, edges)
    assert same == {"value": 0.0, "ci": [0.0, 0.0]}


@pytest.mark.slow
def test_logn_entropy_quick_run_compares_three_conditions_on_the_same_tokens(tmp_path):
    record = run_experiment("logn_entropy", tmp_path, quick=True)
    assert record["verdict"] == SMOKE and record["seed_article"] == "003"
    assert record["runs"] == ["runs/softmax-s0", "runs/logn-s0"]
    assert all((tmp_path / "logn_entropy" / figure).stat().st_size > 0 for figure in record["figures"])
    conditions = record["evidence"]["conditions"]
    assert list(conditions) == ["softmax", "log-n trained", "log-n at evaluation"]
    for c in conditions.values():
        one = c["bpb_ratio"]["32"]  # the training length: its own reference
        assert (one["estimate"], one["lo"], one["hi"]) == (1.0, 1.0, 1.0)
    plain = conditions["softmax"]["entropy_by_keys_seen"]
    switched = conditions["log-n at evaluation"]["entropy_by_keys_seen"]
    # clamped: unchanged inside the training length
    assert switched["mean"][0] == pytest.approx(plain["mean"][0], abs=1e-6)
    assert switched["mean"][-1] != pytest.approx(plain["mean"][-1], abs=1e-6)  # and sharper beyond it
    assert len(record["evidence"]["checks"]) == 3 and len(record["evidence"]["entropy_differences"]) == 2
    assert [c["control"] for c in record["checks"]] == [True, False, False]


@pytest.mark.slow
def test_position_extrapolation_quick_run_pairs_every_condition_with_rope(tmp_path):
    record = run_experiment("position_extrapolation", tmp_path, quick=True)
    assert record["verdict"] == SMOKE and record["runs"] == ["runs/rope-s0", "runs/alibi-s0"]
    conditions = record["evidence"]["conditions"]
    assert list(conditions) == ["rope", "ntk", "rerope", "alibi"]
    assert all((c["ratio"]["32"]["lo"], c["ratio"]["32"]["hi"]) == (1.0, 1.0) for c in conditions.values())
    # a window of 16 < 32: not exact inside T
    assert conditions["rerope"]["bpb"]["32"] != conditions["rope"]["bpb"]["32"]
    differences = record["evidence"]["paired_differences"]
    assert set(differences) == {"rope: bpb ratio at 256", "ntk: bpb at 256 - rope's", "ntk: bpb at 32 - rope's",
                                "rerope: bpb at 256 - rope's", "rerope: bpb at 32 - rope's",
                               "alibi: bpb ratio at 256 - rope's"}
    for d in differences.values():
        assert d["lo"] <= d["estimate"] <= d["hi"]
    judged = {c["name"] for c in record["checks"]}  # "bpb at T" is reported, not judged: inexact by construction
    assert judged == {"rope: bpb ratio at 256", "ntk: bpb at 256 - rope's", "rerope: bpb at 256 - rope's",
                      "alibi: bpb ratio at 256 - rope's"}
    assert all((tmp_path / "position_extrapolation" / f).stat().st_size > 0 for f in record["figures"])


@pytest.mark.slow
def test_position_extrapolation_refuses_an_unknown_extension_before_training(tmp_path):
    from lmzoo.schema import ConfigError

    with pytest.raises(ConfigError, match="extensions='alibi' is not valid"):
        run_experiment("position_extrapolation", tmp_path, quick=True, overrides=["extensions=[alibi]"])
    assert not (tmp_path / "position_extrapolation" / "runs").exists()


def test_sparsity_exponent_is_the_slope_of_log_s_against_log_n():
    from lmzoo.experiments.sparsity_vs_length import exponent

    centres = np.array([12.0, 24.0, 48.0, 96.0])
    one_hot_like = 3.0 * centres**-0.5  # S of a row keeping one key falls as n^(-1/2)
    assert exponent(one_hot_like[None], np.ones((1, 4)), centres)[0] == pytest.approx(-0.5)
    assert exponent(np.full((1, 4), 0.7), np.ones((1, 4)), centres)[0] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.slow
def test_sparsity_vs_length_quick_run_fits_an_exponent_per_variant(tmp_path):
    record = run_experiment("sparsity_vs_length", tmp_path, quick=True)
    assert record["verdict"] == SMOKE and record["runs"] == ["runs/softmax-s0", "runs/linear_elu+1-s0", "runs/gla-s0"]
    assert set(record["evidence"]["checks"]) == {"softmax: alpha", "softmax: S at (16, 32] keys",
                                                 "linear elu+1: alpha - softmax's alpha"}  # gla's alpha: reported only
    for name, curve in record["evidence"]["curves"].items():
        assert curve["octaves"] == ["(8, 16]", "(16, 32]", "(32, 64]", "(64, 128]"]
        assert all(0 < s <= 1 for s in curve["mean"]), name  # S of a row lies in (0, 1]
    exponents = record["evidence"]["exponents"]
    paired = record["evidence"]["checks"]["linear elu+1: alpha - softmax's alpha"]["estimate"]
    assert paired == pytest.approx(exponents["linear elu+1"]["estimate"] - exponents["softmax"]["estimate"], abs=1e-9)
    assert "gla" in exponents
    assert (tmp_path / "sparsity_vs_length" / record["figures"][0]).stat().st_size > 0


@pytest.mark.slow
def test_sparsity_predicted_quick_run_puts_a_point_per_head(tmp_path):
    record = run_experiment("sparsity_predicted", tmp_path, quick=True)
    assert record["runs"] == ["runs/softmax-s0", "runs/gau_relu2-s0", "runs/linear_identity-s0"]
    assert len(record["checks"]) == 7 and sum(c["control"] for c in record["checks"]) == 1
    for name, heads in record["evidence"]["heads"].items():  # [seed][layer x head]
        assert ([len(h) for h in heads["predicted"]] == [len(h) for h in heads["measured"]]
                == [2 if name == "gau relu2" else 8])
        assert all(0 < s <= 1 for s in heads["measured"][0]), name
    gap = record["evidence"]["checks"]["softmax"]["mean_abs_gap"]
    heads = record["evidence"]["heads"]["softmax"]
    assert gap["estimate"] == pytest.approx(np.mean(np.abs(np.subtract(heads["predicted"][0], heads["measured"][0]))))
    assert gap["uncertainty"] == "heads" and gap["lo"] <= gap["estimate"] <= gap["hi"]
    assert (tmp_path / "sparsity_predicted" / record["figures"][0]).stat().st_size > 0


@pytest.mark.parametrize("variant, overrides, weights", [
    ("softmax", [], lambda logits, n: jax.nn.softmax(logits, axis=-1)),
    ("gau", ["attn.weights=relu2"], lambda logits, n: jnp.square(jax.nn.relu(logits)) / n),
    ("linear", ["attn.feature_map=identity", "attn.normalize=false"], lambda logits, n: logits),
])
def test_scored_vectors_give_each_layers_weights(variant, overrides, weights):
    """Their dot products times the scale, put through the layer's weighting, are its attention matrix."""
    from flax import nnx

    from conftest import tiny_config
    from lmzoo.model import LM
    from lmzoo.ops.common import causal_mask

    model = LM(tiny_config(variant, *overrides), 259, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 12, 32))
    mixer = model.blocks[0].mixer
    q, k, scale = mixer.scored_vectors(x)
    mask = causal_mask(12)
    logits = jnp.where(mask, scale * jnp.einsum("bthd,bshd->bhts", q, k), -jnp.inf if variant == "softmax" else 0.0)
    expected = jnp.where(mask, weights(logits, jnp.arange(1, 13)[:, None]), 0.0)
    np.testing.assert_allclose(expected, mixer.attention_matrix(x)[:, : q.shape[2]], rtol=1e-5, atol=1e-6)


def test_mqar_state_size_zoology_scale_sets_the_grid_the_command_line_does_not():
    from lmzoo.config import ConfigError
    from lmzoo.experiments import mqar_state_size as mqar
    from lmzoo.experiments import settings_for

    zoology = mqar.at_scale(settings_for(mqar, ["scale=zoology", "steps=24", "widths=[16,32]"], quick=False))
    assert zoology.steps == 24 and zoology.widths == [16, 32]  # given on the command line: kept
    preset = mqar.SCALES["zoology"]
    assert (zoology.variants, zoology.pairs, zoology.lrs) == (preset["variants"], preset["pairs"], preset["lrs"])
    assert "train.batch_size=64" in zoology.overrides and zoology.seeds == [0, 1, 2]
    assert mqar.at_scale(settings_for(mqar, [], quick=False)) == mqar.Settings()  # the CPU grid is the defaults
    with pytest.raises(ConfigError, match=r"^scale='gpu' is not valid \(choose from: cpu, zoology\)$"):
        mqar.at_scale(settings_for(mqar, ["scale=gpu"], quick=False))


@pytest.mark.slow
def test_mqar_state_size_zoology_scale_dry_run(tmp_path):
    """The zoology grid's path at tiny sizes: every cell's rates and seeds trained as one group, the rate chosen
    on validation, the verdict judged on the scale's settings."""
    overrides = ["scale=zoology", "variants=[softmax]", "widths=[16]", "pairs=[4]", "lrs=[3e-3,1e-2]",
                 "seeds=[0,1]", "steps=16", "seq_len=16", "eval_tokens=256"]
    record = run_experiment("mqar_state_size", tmp_path, overrides=overrides, seed_groups="true")
    grid = record["evidence"]["grid"]
    assert set(grid) == {"softmax"} and set(grid["softmax"]) == {"4"}
    assert set(grid["softmax"]["4"]["16"]["validation_accuracy"]) == {"0.003", "0.01"}
    assert record["settings"]["scale"] == "zoology" and record["verdict"] == "inconclusive"  # 16 steps: no control
    assert len(record["runs"]) == 2 * 2  # one cell: two rates x two seeds, one group
    run = tmp_path / "mqar_state_size" / record["runs"][0]
    trained = OmegaConf.load(run / "config.yaml").train
    assert (trained.batch_size, trained.steps_per_call) == (64, 8)  # the scale's training settings


@pytest.mark.slow
def test_mqar_state_size_quick_run_grids_accuracy_against_state(tmp_path):
    record = run_experiment("mqar_state_size", tmp_path, quick=True)
    grid = record["evidence"]["grid"]
    assert set(grid) == {"softmax", "gla"} and set(grid["gla"]) == {"2", "4"}
    for by_pairs in grid.values():
        for by_width in by_pairs.values():
            best = by_width["32"]
            accuracy = best["accuracy"]
            assert 0 <= accuracy["lo"] <= accuracy["estimate"] <= accuracy["hi"] <= 1 and best["lr"] == 3e-3
            assert set(best["validation_accuracy"]) == {"0.003"} and best["chance"] == 1 / 32
    assert grid["gla"]["2"]["32"]["state_floats"] == grid["gla"]["4"]["32"]["state_floats"]  # pairs change no shape
    assert grid["softmax"]["2"]["32"]["state_floats"] > grid["gla"]["2"]["32"]["state_floats"]  # a 32-token cache
    checks = {c["name"]: c for c in record["checks"]}
    assert set(checks) == {"softmax: accuracy at its worst setting", "gla: accuracy, 2 pairs - 4 pairs, width 32"}
    assert checks["softmax: accuracy at its worst setting"]["control"] and record["verdict"] == SMOKE
    assert len(record["runs"]) == 4 and (tmp_path / "mqar_state_size" / record["figures"][0]).stat().st_size > 0
    run = tmp_path / "mqar_state_size" / record["runs"][0]
    # chosen, then tested
    assert {p.name for p in (run / "eval").iterdir()} == {"mqar_state_size", "mqar_state_size_test"}
