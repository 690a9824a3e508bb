"""What a newcomer meets at the command line: a variant without its plus gets the hint, ``--help`` spells out
constants and describes every setting, each command lists the exit codes it can end with, the experiments list
names articles as articles."""

from __future__ import annotations

import pytest

from lmzoo import compare, generate, lm_eval, train
from lmzoo.experiments import __main__ as experiments


def help_of(main, *before: str) -> str:
    with pytest.raises(SystemExit) as stop:
        main([*before, "--help"])
    assert stop.value.code == 0
    return stop


def test_a_variant_without_its_plus_gets_the_hint(capsys):
    with pytest.raises(SystemExit) as stop:
        train.main(["attn=softmax"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == ("lmzoo: error: attn=softmax: attn is added with a plus: +attn=softmax "
                                       "(train.yaml picks no attn by default)\n")


def test_training_help_spells_out_constants_and_describes_the_mesh(capsys):
    help_of(train.main)
    out = capsys.readouterr().out
    assert "KINDS" not in out and "one of rope, pi, ntk, yarn, rerope, leaky_rerope, alibi, none" in out
    for key in ("train.mesh.data", "train.mesh.fsdp", "train.mesh.tensor", "train.mesh.rules"):
        line = next(line for line in out.splitlines() if line.strip().startswith(key + "="))
        assert len(line.split("  ")) > 2 and line.split("  ")[-1].strip(), line  # a description after the default


@pytest.mark.parametrize("main, codes", [(compare.main, ["0", "2", "5", "7", "130"]),
                                         (generate.main, ["0", "2", "4", "7", "75", "130"]),
                                         (lm_eval.main, ["0", "2", "4", "5", "7", "75", "130"]),  # never 3: no training
                                         (train.main, ["0", "2", "3", "4", "5", "6", "7", "75", "130"])])
def test_each_command_lists_the_exit_codes_it_can_end_with(main, codes, capsys):
    help_of(main)
    listed = capsys.readouterr().out.split("exit codes:\n")[1].splitlines()
    assert [line.split()[0] for line in listed] == codes


def test_the_experiments_list_names_the_source_article(capsys):
    """Each experiment's source article by number and title, or that it goes beyond them, as docs/claims.md
    says; never "seed", which is a random seed here."""
    experiments.main(["list"])
    out = capsys.readouterr().out
    assert "seed" not in out.replace("seed_groups", "").replace("seeds", "").lower()
    assert "sparsity_closed_forms  (from source article 001: Can attention really concentrate?" in out
    assert "state_tracking  (beyond the source articles" in out and "state_passing  (beyond the source articles" in out


def test_an_experiment_out_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SystemExit) as stop:
        experiments.main(["decode_cache", "quick=true", f"out_dir={tmp_path / 'a_file'}"])
    assert stop.value.code == 4
    assert capsys.readouterr().err == (f"lmzoo: error: out_dir '{tmp_path / 'a_file'}' is a file, not a directory; "
                                       "pick another out_dir\n")
