"""One vocabulary of forms: every op and every mixer spec names its computation forms from one set of
words, "naive" (the reference) first; an op takes only today's names (the names older runs saved are
renamed where a saved run is read: tests/record/test_migrate.py)."""

from __future__ import annotations

import importlib
import pkgutil

import jax.numpy as jnp
import pytest

import lmzoo.ops
from lmzoo import registry
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


@pytest.mark.parametrize("name", sorted(spec_forms()))
def test_every_spec_defaults_to_a_form_by_its_current_name(name):
    spec = registry.lookup(name)
    default = spec.__dataclass_fields__["method"].default
    assert default in spec.forms, f"attn={name}: method defaults to {default!r}, not one of {spec.forms}"


def test_an_op_refuses_a_name_of_its_form_from_before_the_one_vocabulary():
    """The op API knows today's names only: ``scan`` was the delta rule's and the LTI SSM's reference once."""
    args = delta_args("channel", 9, with_state=True)
    with pytest.raises(ValueError, match=r"method='scan' is not valid \(choose from: naive, parallel, chunk"):
        delta_rule(args["q"], args["k"], args["v"], args["beta"], args["log_g"], method="scan")
    u = jnp.zeros((1, 3, 2), jnp.float32)
    with pytest.raises(ValueError, match=r"method='scan' is not valid \(choose from: naive, fft\)"):
        diagonal_ssm(u, -jnp.ones((2, 2)), jnp.ones((2, 2)), jnp.ones((2, 2)), method="scan")


def test_a_name_that_is_not_a_form_is_refused_with_the_forms():
    with pytest.raises(ValueError, match=r"method='fused' is not valid \(choose from: naive, chunk\)"):
        check_form("fused", Forms("naive", "chunk"))
