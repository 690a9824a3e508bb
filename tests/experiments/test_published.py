"""The published numbers: every committed file loads, every number carries its citation, cells keep the rounding
they were printed with, and a malformed file is one line naming what is wrong."""

from __future__ import annotations

import pytest

from lmzoo.experiments import published
from lmzoo.experiments.published import PublishedError, load
from lmzoo.registry import MIXERS
from lmzoo.schema import ConfigError


def test_every_committed_number_carries_its_citation_and_parses():
    assert {"mad", "mqar", "state_tracking"} <= set(published.yardsticks())
    for yardstick in published.yardsticks():
        numbers = load(yardstick)
        assert numbers
        for n in numbers:
            c = n.citation
            assert c.paper and c.arxiv and c.where and c.setting and c.read_from and n.row and n.column and n.metric
            assert n.scale[0] <= n.range[0] <= n.value <= n.range[1] <= n.scale[1]
            assert n.variant is None or n.variant in MIXERS.names(), n.variant  # a counterpart lmzoo really has


def test_the_mad_table_reads_as_printed():
    numbers = load("mad")
    cell = {(n.source, n.row, n.column): n for n in numbers}
    transformer = cell["deltanet_mad", "Transformer", "in_context_recall"]
    assert transformer.printed == "94.1" and transformer.variant == "softmax"
    assert transformer.range == pytest.approx((94.05, 94.15))
    assert "2406.06484" in transformer.cite() and "Transformer" in transformer.cite()
    assert cell["deltanet_mad", "DeltaNet", "selective_copying"].range == (99.5, 100.0)  # "100": clipped to the scale
    assert cell["metala_mad", "GLA", "memorization"].range == pytest.approx((57.045, 57.055))
    # each row's printed average is the mean of its six tasks, to the table's rounding
    for source, row in {(n.source, n.row) for n in numbers}:
        tasks = [cell[source, row, c].value for c in ("compression", "fuzzy_recall", "in_context_recall",
                                                      "memorization", "noisy_recall", "selective_copying")]
        average = cell[source, row, "average"]
        assert abs(sum(tasks) / 6 - average.value) < 0.06, (source, row)


def test_a_bound_is_kept_as_a_bound():
    solved = published.column(load("mqar"), "metala_mqar_512_80", "accuracy")["softmax"]
    assert solved.printed == ">99.0" and solved.value == 99.0 and solved.range == (99.0, 100.0)


def test_a_column_without_counterparts_or_an_unknown_source_is_one_line():
    with pytest.raises(PublishedError, match="sources: deltanet_mad, metala_mad"):
        published.column(load("mad"), "no_such_table", "average")
    with pytest.raises(ConfigError, match="yardstick='nope' is not valid"):
        load("nope")


def write(folder, text):
    (folder / "bad.yaml").write_text(text)
    return folder


HEAD = "metric: m\nhigher_is_better: true\nscale: [0, 100]\ncolumns: [a, b]\n"
SOURCE = ("sources:\n  - {key: s, paper: p, authors: x, venue: v, arxiv: '1', where: 'Table 1', read_from: r, "
          "setting: z, rows: [ROWS]}\n")


@pytest.mark.parametrize("rows, message", [
    ("{row: R, variant: null, cells: ['1.0']}", "row R: 1 cells for 2 columns"),
    ("{row: R, variant: null, cells: ['1.0', 2.5]}", "cell 2.5 is not a number as printed"),
    ("{row: R, variant: null, cells: ['1.0', 'about 3']}", "'about 3' is not a number as printed"),
    ("{row: R, cells: ['1.0', '2']}", "a row: missing variant"),
])
def test_a_malformed_table_names_what_is_wrong(tmp_path, rows, message):
    folder = write(tmp_path, HEAD + SOURCE.replace("ROWS", rows))
    with pytest.raises(PublishedError, match=message):
        load("bad", folder)


def test_a_source_without_its_citation_is_refused(tmp_path):
    folder = write(tmp_path, HEAD + SOURCE.replace("arxiv: '1', ", "").replace("ROWS", ""))
    with pytest.raises(PublishedError, match="source s: missing arxiv"):
        load("bad", folder)


NEGATIVE = "deltaproduct[attn.householder_steps=1, attn.negative_eigenvalues=true, attn.gate=none]"


def test_the_state_tracking_table_keeps_its_scale_and_rows():
    parity = published.column(load("state_tracking"), "grazzi_formal_languages", "parity")
    assert set(parity) == {"softmax", "mlstm", "mamba", "mamba[attn.negative_eigenvalues=true]", "deltanet", NEGATIVE}
    assert parity["mlstm"].row == "mLSTM" and parity["mlstm"].printed == "0.087"
    assert parity["mamba[attn.negative_eigenvalues=true]"].row == "Mamba [-1, 1]"
    assert parity[NEGATIVE].row == "DeltaNet [-1, 1]" and parity[NEGATIVE].printed == "1.000"
    assert parity[NEGATIVE].record()["overrides"] == ["attn.householder_steps=1", "attn.negative_eigenvalues=true",
                                                      "attn.gate=none"]
    assert parity["deltanet"].printed == "0.017" and parity["deltanet"].range == pytest.approx((0.0165, 0.0175))
    assert parity["mamba"].range == (0.0, 0.0005)  # "0.000" clipped to the scale's floor


@pytest.mark.parametrize("rows, message", [
    ("{row: R, variant: deltaproduct, cells: ['1', '2'], overrides: [attn.steps=1]}",
     r"row R: override 'attn.steps=1' is not attn.<field>=<value> for a field of deltaproduct's config \(its fields: "),
    ("{row: R, variant: deltaproduct, cells: ['1', '2'], overrides: [attn.check=1]}", "'attn.check=1' is not attn"),
    ("{row: R, variant: deltaproduct, cells: ['1', '2'], overrides: [model.d_model=8]}",
     "'model.d_model=8' is not attn"),
    ("{row: R, variant: deltaproduct, cells: ['1', '2'], overrides: [attn.householder_steps=two]}",
     "override 'attn.householder_steps=two': str, where attn.householder_steps is int"),
    ("{row: R, variant: null, cells: ['1', '2'], overrides: [attn.gate=none]}", "row R: overrides .* need a variant"),
    ("{row: R, variant: nope, cells: ['1', '2'], overrides: [attn.gate=none]}", "variant 'nope' is not a registered"),
])
def test_a_wrong_override_is_one_line(tmp_path, rows, message):
    folder = write(tmp_path, HEAD + SOURCE.replace("ROWS", rows))
    with pytest.raises(PublishedError, match=message):
        load("bad", folder)


def test_every_committed_override_resolves_to_a_config():
    from lmzoo.cli import compose_and_validate

    overridden = {(n.variant, n.overrides) for y in published.yardsticks() for n in load(y) if n.overrides}
    overridden |= {(s.variant, s.overrides) for name in published.separation_files()
                   for s in published.load_separations(name) if s.overrides}
    assert len(overridden) > 1  # DeltaNet [-1, 1] and the DeltaProduct README's rows at least
    for variant, overrides in overridden:
        cfg = compose_and_validate([f"+attn={variant}", *overrides])
        for override in overrides:
            key, value = override.removeprefix("attn.").split("=")
            assert str(getattr(cfg.attn, key)).lower() == value.lower()


def test_every_stated_separation_carries_its_sentence_and_citation():
    assert "word_problems" in published.separation_files()
    for name in published.separation_files():
        separations = published.load_separations(name)
        assert separations
        for s in separations:
            c = s.citation
            assert c.paper and c.arxiv and c.where and c.setting and c.read_from and s.row and s.column and s.metric
            assert s.says in published.SAYS and s.printed.strip()
            assert s.variant is None or s.variant in MIXERS.names(), s.variant
    s3 = published.stated(published.load_separations("word_problems"), "deltaproduct_readme_s3", "S3")
    two = s3["deltaproduct[attn.householder_steps=2, attn.negative_eigenvalues=true, attn.gate=none]"]
    assert (two.row, two.says, two.printed) == ("DeltaProduct_2[-1, 1]", "solves",
                                                "This configuration is expected to train successfully.")
    assert sorted(s.says for s in s3.values()) == ["fails", "fails", "fails", "solves"]


@pytest.mark.parametrize("rows, message", [
    ("{row: R, variant: null, says: [solves], printed: ['It trains.']}", "row R: 1 says and 1 printed for 2 columns"),
    ("{row: R, variant: null, says: [maybe, null], printed: ['It might.', null]}",
     r"row R: says 'maybe' with printed 'It might.' \(says: one of solves, fails, with the source's sentence\)"),
    ("{row: R, variant: null, says: [solves, fails], printed: ['It trains.', '']}", "says 'fails' with printed ''"),
    ("{row: R, variant: null, says: [solves, null]}", "row R: missing printed"),
])
def test_a_malformed_separation_names_what_is_wrong(tmp_path, rows, message):
    folder = write(tmp_path, "metric: m\ncolumns: [a, b]\n" + SOURCE.replace("ROWS", rows))
    with pytest.raises(PublishedError, match=message):
        published.load_separations("bad", folder)
