"""The grammar every command shares (``lmzoo.cli``): ``--help`` lists the keys and exits 0, and a
bad argument is one line with exit code 2, the same for every command; every command but train reads its
settings dataclass with one parser (``parse_settings``)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Optional

import pytest

from lmzoo import compare, eval as lmzoo_eval, generate, train
from lmzoo.cli import parse_settings, schema_options, shown_as
from lmzoo.config import ConfigError
from lmzoo.experiments import __main__ as experiments

from conftest import REPO

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
    ("train", ["+attn=softmax", "run_dir=runs/données"], "quote the value for Hydra, as \"run_dir='runs/données'\""),
    ("compare", ["/nonexistent", "colour=red"],
     "unknown key 'colour' (valid keys: baseline, tag, out, adjust, same_seed, pair)"),
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


# ----------------------------------------------------------------------------- the one parser of settings


@dataclass
class Inner:
    depth: int = 1  # how deep


@dataclass
class Example:
    """Settings of a made-up command, to test ``lmzoo.cli.parse_settings`` apart from any real one."""

    name: Optional[str] = shown_as("<name>")  # who; taken verbatim
    count: int = 3  # how many
    ratio: Optional[float] = None  # a share; null: none
    flag: bool = False  # a switch
    inner: Inner = field(default_factory=Inner)


def test_settings_take_text_verbatim_and_other_values_by_their_type():
    s = parse_settings(Example, ["name= a b ", "count=5", "ratio=0.5", "flag=true", "inner.depth=2"], "x").settings
    assert s == Example(name=" a b ", count=5, ratio=0.5, flag=True, inner=Inner(2))
    assert parse_settings(Example, ["name=null", "ratio=null"], "x").settings == Example()
    assert parse_settings(Example, [], "x", defaults={"count": 7}).settings.count == 7  # defaults lie under arguments


@pytest.mark.parametrize("argv, message", [
    (["count=x"], "count='x' must be a whole number"),
    (["ratio=many"], "ratio='many' must be a number or null"),
    (["ratio=inf"], "ratio=inf must be a finite number"),
    (["flag=maybe"], "flag='maybe' must be true or false"),
    (["colour=red"], "unknown key 'colour' (valid keys: name, count, ratio, flag, inner)"),
    (["inner.width=2"], "unknown key 'inner.width' (valid keys here: depth)"),
    (["oops"], "could not parse 'oops': arguments are key=value (python -m lmzoo.x --help lists them)"),
])
def test_a_bad_setting_is_one_line_naming_the_key(argv, message):
    with pytest.raises(ConfigError) as error:
        parse_settings(Example, argv, "x")
    assert str(error.value) == message


def test_other_keys_paths_and_dashes_where_a_command_takes_them():
    parsed = parse_settings(Example, ["runs/a", "pos=ntk", "--count", "4", "--name=b"], "x", others=True, paths=True,
                            dashes=True)
    assert (parsed.settings.count, parsed.settings.name, parsed.others, parsed.paths) == (4, "b", ["pos=ntk"],
                                                                                         ["runs/a"])
    with pytest.raises(ConfigError, match="unknown option '--colour'"):
        parse_settings(Example, ["--colour", "red"], "x", dashes=True)


def test_help_lines_come_from_the_fields_defaults_and_comments():
    lines = {o.key: (o.default, o.note) for o in schema_options(Example)}
    assert lines == {"name": ("<name>", "who; taken verbatim"), "count": ("3", "how many"),
                     "ratio": ("null", "a share; null: none"), "flag": ("false", "a switch"),
                     "inner.depth": ("1", "how deep")}


# ----------------------------------------------------------------------------- the compilation cache

CACHED_PROGRAM = ("import sys; from lmzoo.cli import use_compilation_cache; print(use_compilation_cache()); "
                  "import jax; jax.config.update('jax_persistent_cache_min_compile_time_secs', 0); "
                  "jax.jit(lambda x: x * 2 + 1)(1.0).block_until_ready(); "
                  "print(jax.config.jax_compilation_cache_max_size)")


def cache_env(**env) -> dict:
    """The environment without the suite's own cache folder, plus ``env``."""
    return {**{k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}, "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": str(REPO), **env}


def test_commands_keep_compiled_programs_in_lmzoo_s_cache_folder(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CACHED_PROGRAM], env=cache_env(LMZOO_CACHE=str(tmp_path)),
                          capture_output=True, text=True, timeout=300)
    folder, max_size = proc.stdout.split()
    assert proc.returncode == 0 and folder == str(tmp_path / "xla") and int(max_size) == 4 * 2**30, proc.stderr
    assert any((tmp_path / "xla").iterdir())  # the program was written there


@pytest.mark.parametrize("setting", ["off", "a_file"])
def test_the_compilation_cache_can_be_turned_off_and_a_bad_folder_only_warns(tmp_path, setting):
    (tmp_path / "a_file").write_text("")
    env = cache_env(LMZOO_CACHE=str(tmp_path / "cache"),
                    LMZOO_COMPILATION_CACHE=setting if setting == "off" else str(tmp_path / "a_file"))
    proc = subprocess.run([sys.executable, "-c", CACHED_PROGRAM], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.split()[0] == "None", proc.stderr
    assert not (tmp_path / "cache").exists()
    assert ("no compilation cache" in proc.stderr) == (setting == "a_file")


def test_a_hook_for_late_reports_set_inside_a_command_outlives_it():
    """A failed restore silences the "Event loop is closed" reports TensorStore's threads make as the process exits;
    the command's own interrupt hook, undone when its body ends, must not take that silencer with it."""
    from lmzoo.cli import interrupts_in_one_line
    from lmzoo.record.checkpoints import silence_closed_loop_callbacks

    before = sys.unraisablehook
    try:
        with interrupts_in_one_line("nothing was done"):
            pass
        assert sys.unraisablehook is before  # nothing added: the command leaves the hook it found
        with interrupts_in_one_line("nothing was done"):
            silence_closed_loop_callbacks()
        assert getattr(sys.unraisablehook, "drops_closed_loop_callbacks", False)
    finally:
        sys.unraisablehook = before


@pytest.mark.parametrize("argv", [["lmzoo.experiments"], ["lmzoo.train", "--help"]])  # run_command; train's own
def test_a_reader_that_stops_reading_stops_the_command_quietly(argv):
    # as `python -m lmzoo.experiments | head -1`: the pipe is closed before the command writes its first line
    proc = subprocess.Popen([sys.executable, "-m", *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and err == "", err
