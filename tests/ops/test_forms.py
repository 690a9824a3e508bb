"""One vocabulary of forms: every op and every mixer spec names its computation forms from one set of
words, "naive" (the reference) first; the names older runs saved map onto today's with a one-line note
and compute the same numbers."""

from __future__ import annotations

import importlib
import logging
import pkgutil

import jax.numpy as jnp
import numpy as np
import pytest

import lmzoo.ops
from lmzoo import registry
from lmzoo.ops import common
from lmzoo.ops.common import Forms, check_form
from lmzoo.ops.delta import delta_rule
from lmzoo.ops.lti import diagonal_ssm

from op_checks import delta_args

# The words a form may be called; what each means is in ``lmzoo.ops.common.Forms``.
VOCABULARY = {"naive", "parallel", "chunk", "chunk_recompute", "blocked", "scan", "assoc", "fft", "gather", "pallas",
              "xla", "cudnn", "jla", "auto"}


def op_forms() -> dict[str, Forms]:
    """Every op module's ``METHODS``, by module name."""
    found = {}
    for info in pkgutil.iter_modules(lmzoo.ops.__path__):
        module = importlib.import_module(f"lmzoo.ops.{info.name}")
        if hasattr(module, "METHODS"):
            found[info.name] = module.METHODS
    return found


def spec_forms() -> dict[str, Forms]:
    """The forms of every registered mixer spec that has an ``attn.method``."""
    specs = {name: registry.lookup(name) for name in registry.names()}
    return {name: spec.forms for name, spec in specs.items() if "method" in spec.__dataclass_fields__}


ALL_FORMS = {**{f"ops.{k}": v for k, v in op_forms().items()}, **{f"attn={k}": v for k, v in spec_forms().items()}}


def test_the_ops_are_found():
    assert {"delta", "dplr", "comba", "delta_product", "gated", "ssd", "selective_scan", "lti", "nsa", "vq",
            "attention"} <= set(op_forms())
    assert {"deltanet", "h3", "nsa", "vq", "softmax", "mamba"} <= set(spec_forms())


@pytest.mark.parametrize("owner", sorted(ALL_FORMS))
def test_every_op_and_spec_lists_its_reference_naive_first_in_the_one_vocabulary(owner):
    forms = ALL_FORMS[owner]
    assert isinstance(forms, Forms), (f"{owner}: its forms are a plain {type(forms).__name__}, "
                                      "not lmzoo.ops.common.Forms")
    assert forms[0] == "naive", f"{owner}: {forms}"
    assert set(forms) <= VOCABULARY, f"{owner}: {set(forms) - VOCABULARY} outside the vocabulary"
    assert len(set(forms)) == len(forms)


@pytest.mark.parametrize("owner", sorted(ALL_FORMS))
def test_each_alias_maps_to_a_form_and_is_not_one(owner):
    forms = ALL_FORMS[owner]
    for old, new in forms.aliases.items():
        assert new in forms and old not in forms, f"{owner}: {old} -> {new}"


@pytest.mark.parametrize("name", sorted(spec_forms()))
def test_every_spec_defaults_to_a_form_by_its_current_name(name):
    spec = registry.lookup(name)
    default = spec.__dataclass_fields__["method"].default
    assert default in spec.forms, f"attn={name}: method defaults to {default!r}, not one of {spec.forms}"


def test_scan_is_never_a_reference_and_the_old_names_are_kept():
    """The renames this vocabulary made: a saved ``attn.method`` of each still resolves."""
    renamed = {"delta": {"scan": "naive"}, "dplr": {"scan": "naive"}, "comba": {"scan": "naive"},
               "delta_product": {"scan": "naive"}, "lti": {"scan": "naive"}, "nsa": {"dense": "parallel"},
               "vq": {"blockwise": "blocked"}}
    forms = op_forms()
    for op, aliases in renamed.items():
        assert forms[op].aliases == aliases, op
    assert spec_forms()["h3"].aliases == {"quadratic": "parallel", "scan": "naive"}


@pytest.fixture
def fresh_notes(monkeypatch):
    """Forget which old names were noted, so this test sees its own note."""
    monkeypatch.setattr(common, "_NOTED", set())


def notes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "lmzoo.ops" and r.getMessage().startswith("note:")]


def test_an_old_name_is_noted_in_one_line_once(fresh_notes, caplog):
    forms = Forms("naive", "chunk", aliases={"scan": "naive"})
    with caplog.at_level(logging.WARNING, logger="lmzoo.ops"):
        assert check_form("scan", forms) == "naive"
        assert check_form("scan", forms) == "naive"
        assert check_form("naive", forms) == "naive"
    assert notes(caplog) == [
        "note: method='scan' is the old name of 'naive'; running 'naive' (the forms: naive, chunk)"]


def test_a_name_that_is_neither_a_form_nor_an_alias_is_refused_with_the_forms():
    with pytest.raises(ValueError, match=r"method='fused' is not valid \(choose from: naive, chunk\)"):
        check_form("fused", Forms("naive", "chunk", aliases={"scan": "naive"}))


def test_the_delta_rule_under_its_old_reference_name_computes_the_same(fresh_notes, caplog):
    args = delta_args("channel", 9, with_state=True)
    with caplog.at_level(logging.WARNING, logger="lmzoo.ops"):
        old = delta_rule(args["q"], args["k"], args["v"], args["beta"], args["log_g"], initial_state=args["state"],
                         method="scan")
    new = delta_rule(args["q"], args["k"], args["v"], args["beta"], args["log_g"], initial_state=args["state"],
                     method="naive")
    for a, b in zip(old, new):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert len(notes(caplog)) == 1


def test_the_lti_recurrence_under_its_old_name_computes_the_same(fresh_notes):
    rng = np.random.default_rng(0)
    u = jnp.asarray(rng.standard_normal((2, 7, 3)), jnp.float32)
    log_a = jnp.asarray(-rng.uniform(0.01, 0.5, (3, 4)), jnp.float32)
    b, c = (jnp.asarray(rng.standard_normal((3, 4)), jnp.float32) for _ in range(2))
    for a, b_ in zip(diagonal_ssm(u, log_a, b, c, method="scan"), diagonal_ssm(u, log_a, b, c, method="naive")):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b_))
