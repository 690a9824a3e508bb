"""The interop commands share every command's grammar: --help lists the keys, a mistake is one line with exit code 2."""

from __future__ import annotations

import pytest

from lmzoo import export, lm_eval

COMMANDS = {"export": (export.main, ["run_dir=<dir>", "out=<folder>", "format=hf", "step=null"]),
            "lm_eval": (lm_eval.main, ["run_dir=<dir>", "hf=<folder>", "tasks=<task,...>", "include_path=null",
                                       "tag=default"])}


@pytest.mark.parametrize("command", COMMANDS)
def test_help_lists_the_keys_and_exits_0(command, capsys):
    main, keys = COMMANDS[command]
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and out.startswith(f"usage: python -m lmzoo.{command}")
    assert all(key in out for key in [*keys, "exit codes:"]), out


@pytest.mark.parametrize("command, argv, fragment", [
    ("export", ["run_dir=/nonexistent"], "out=<...> is required"),
    ("export", ["run_dir=/nonexistent", "out=x", "format=onnx"], "format='onnx' is not valid (choose from: hf, fla)"),
    ("export", ["run_dir=/nonexistent", "out=x", "step=last"], "step='last' must be a whole number or null"),
    ("export", ["run_dir=/nonexistent", "out=x"], "holds no trained run"),
    ("export", ["run_dir=/nonexistent", "out=x", "colour=red"], "unknown key 'colour'"),
    ("lm_eval", ["run_dir=/nonexistent", "tasks=x", "limit=many"], "limit='many' must be a number"),
    ("lm_eval", ["run_dir=/nonexistent", "tasks=x", "batch_size=two"], "batch_size='two' must be a whole number"),
    ("lm_eval", ["oops"], "could not parse 'oops': arguments are key=value"),
])
def test_bad_arguments_are_one_line_with_exit_code_2(command, argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        COMMANDS[command][0](argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and fragment in err, err
