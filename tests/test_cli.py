"""The grammar every command shares (``lmzoo.cli``): ``--help`` lists the keys and exits 0, and a
bad argument is one line with exit code 2, the same for every command."""

from __future__ import annotations

import pytest

from lmzoo import compare, eval as lmzoo_eval, generate, train
from lmzoo.experiments import __main__ as experiments

COMMANDS = {  # each command's main, and keys its --help must list
    "train": (train.main, [],
              ["+attn=<variant>", "optim.lr=0.003", "train.steps=600", "pos=<option>", "data.seq_len="]),
    "eval": (lmzoo_eval.main, [], ["run_dir=<dir>", "eval.tokens=262144", "eval.tag=null", "pos=<option>"]),
    "generate": (generate.main, [], ["prompt=<text>", "temperature=0.8", "top_p=null", "attn.<key>=<value>"]),
    "compare": (compare.main, [], ["baseline=null", "tag=default", "out="]),
    "experiments": (lambda argv: experiments.main(argv), ["decode_cache"], ["quick=false", "out_dir=experiments"]),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_the_keys_with_defaults_and_exits_0(command, flag, capsys):
    main, before, keys = COMMANDS[command]
    with pytest.raises(SystemExit) as exit_info:
        main([*before, flag])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m lmzoo.")
    for key in [*keys, "exit codes:", "  2 "]:
        assert key in out, (key, out)


@pytest.mark.parametrize("command, argv, fragment", [
    ("eval", ["run_dir=/nonexistent", "oops"], "could not parse 'oops': arguments are key=value"),
    ("generate", ["oops"], "could not parse 'oops': arguments are key=value"),
    ("experiments", ["decode_cache", "oops"], "could not parse 'oops': arguments are key=value"),
    ("train", ["+attn=softmax", "oops"], "could not parse 'oops': arguments are key=value"),
    ("compare", ["/nonexistent", "colour=red"],
     "unknown key 'colour' (valid keys: baseline, tag, out, adjust, same_seed)"),
    ("compare", ["/nonexistent", "--colour", "red"], "unknown option '--colour'"),
    ("compare", [], "no run given"),
    ("generate", ["run_dir=/nonexistent", "prompt=a", "temperature=nan"], "temperature=nan must be a finite number"),
    ("eval", ["run_dir=/nonexistent", "eval.memory_budget_gb=inf"],
     "eval.memory_budget_gb=inf must be a finite number"),
    ("experiments", ["sparsity_closed_forms", "tolerance=nan"], "tolerance=nan must be a finite number"),
])
def test_bad_arguments_are_one_line_with_exit_code_2_in_every_command(command, argv, fragment, capsys):
    main, _, _ = COMMANDS[command]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("lmzoo: error: ") and fragment in err, err
