"""Faults at run time: their exit codes, one-line errors, the run lock and the write probe.

A fault a user can act on (a diverged run, a run directory another trainer holds, no intact
checkpoint) ends the process with one line on stderr and an exit code saying which it was.
``LMZOO_DEBUG=1`` raises instead, so a real bug behind a fault still shows its traceback.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import NoReturn

PROBE_BYTES = 1 << 16  # what a write probe writes: about what a run writes before its first step (configs, logs)

# Exit codes of every command (an unexpected error keeps Python's 1).
EXIT_FINISHED = 0  # finished
EXIT_CONFIG = 2  # a bad setting or command line: nothing was run
EXIT_DIVERGED = 3  # too many non-finite steps in a row; the checkpoints on disk stay finite
EXIT_RUN_FAULT = 4  # the run directory cannot be used: held, unwritable, no intact checkpoint, other data
EXIT_WRITE_FAILED = 5  # a file could not be written (disk full, permissions); what was on disk before is intact
EXIT_NETWORK = 6  # data could not be downloaded (no network, or the server refused): nothing was run
EXIT_UNPARSABLE = 7  # a config file is not valid YAML (its line and column named): nothing was run
EXIT_INTERRUPTED = 75  # stopped by SIGTERM (or Ctrl-C in training), all saved intact: run it again (EX_TEMPFAIL)
EXIT_ABORTED = 130  # stopped at once by Ctrl-C (a second one in training): nothing half-written, earlier files intact


class RunFault(Exception):
    """A fault of the run (not of its settings); the message is one line for the terminal."""

    exit_code = EXIT_RUN_FAULT


class Diverged(RunFault):
    exit_code = EXIT_DIVERGED


class WriteFault(RunFault):
    """A write that failed; files are replaced whole, so the earlier version stays intact."""

    exit_code = EXIT_WRITE_FAILED


class NetworkFault(RunFault):
    """Data that had to be downloaded could not be."""

    exit_code = EXIT_NETWORK


class UnparsableConfig(RunFault):
    """A config file that is not valid YAML."""

    exit_code = EXIT_UNPARSABLE


class Stopped(KeyboardInterrupt):
    """SIGTERM outside a training loop: stop the command as Ctrl-C would, but with the code a requeue expects."""


class Interrupted(RunFault):
    """A run stopped by SIGTERM / Ctrl-C after saving a checkpoint: the same command resumes it."""

    exit_code = EXIT_INTERRUPTED


REDELIVERY_DELAY_S = 0.05  # after a swallowed interrupt: long enough for the callback it landed in to return


def redelivering(previous=None):
    """A ``sys.unraisablehook``: Ctrl-C or SIGTERM raised inside code whose exceptions Python only prints ("Exception
    ignored in: <function _xla_gc_callback ...>": JAX's garbage-collection callback, a ``__del__``) would be lost, and
    the command would go on. Such an interrupt is sent again a moment later, from a thread of its own, so that it
    lands in the code running then (a hook that sent it at once would only meet it inside itself). Every other
    unraisable error goes on to ``previous`` (Python's own hook by default)."""
    def hook(unraisable) -> None:
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):
            (previous or sys.__unraisablehook__)(unraisable)
            return
        signum = signal.SIGTERM if issubclass(unraisable.exc_type, Stopped) else signal.SIGINT
        # a real signal to the main thread: it also wakes a sleep or a wait there, as the first one did
        timer = threading.Timer(REDELIVERY_DELAY_S, signal.pthread_kill, (threading.main_thread().ident, signum))
        timer.daemon = True
        timer.start()

    return hook


def exit_at_once(signum, frame) -> NoReturn:
    """Ctrl-C while a command starts (``stop_in_one_line_while_starting``): one line, exit 130, at once."""
    print("lmzoo: error: stopped by Ctrl-C while starting; nothing was done", file=sys.stderr, flush=True)
    os._exit(EXIT_ABORTED)


def stop_in_one_line_while_starting() -> None:
    """What ``python -m lmzoo.<command>`` sets first (``lmzoo/__init__``), before the command's modules import JAX:
    Ctrl-C ends the process at once with one line and exit 130, raising nothing. A KeyboardInterrupt raised while
    JAX's native modules load can crash the interpreter (SIGSEGV), one raised in its garbage-collection callback is
    lost, and either way a traceback would be printed. The command's own wrapper
    (``lmzoo.cli.interrupts_in_one_line``) takes over once it runs; ``LMZOO_DEBUG=1`` keeps Python's handling."""
    if not debugging() and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, exit_at_once)


def unparsable(error) -> UnparsableConfig:
    """One line for a YAML file that does not parse (a ``yaml.YAMLError``): the file, the place and the problem."""
    mark = getattr(error, "problem_mark", None)
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else "a config file"
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return UnparsableConfig(f"{where} does not parse as YAML ({problem}); fix that file")


def debugging() -> bool:
    """Whether faults should raise with their traceback instead of becoming one line (``LMZOO_DEBUG=1``)."""
    return os.environ.get("LMZOO_DEBUG", "") not in ("", "0")


def first_line(error: BaseException, limit: int = 160) -> str:
    """``Type: first line of the message``, cut to ``limit`` characters: enough to tell faults apart."""
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def probe_writable(directory: Path, what: str) -> None:
    """Create ``directory`` and write a file in it, so a bad path fails now rather than after training steps."""
    try:
        exists = directory.exists()
        is_file, dangling = exists and not directory.is_dir(), directory.is_symlink() and not exists
    except OSError as e:  # a name longer than the file system takes
        raise RunFault(f"{what} {str(directory)!r} cannot be a directory ({e.strerror or first_line(e)}); "
                       f"pick another {what}") from None
    if is_file:
        raise RunFault(f"{what} {str(directory)!r} is a file, not a directory; pick another {what}")
    if dangling:  # a link to itself, or to a place that is gone
        raise RunFault(f"{what} {str(directory)!r} is a symbolic link that leads to no directory "
                       f"({os.readlink(directory)!r}); pick another {what}")
    probe = directory / f".write-probe-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:  # some bytes, synced: an empty file still fits on a full disk
            f.write(bytes(PROBE_BYTES))
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as e:
        remove_quietly(probe)
        fault = WriteFault if e.errno == errno.ENOSPC else RunFault
        raise fault(f"{what} {str(directory)!r} is not writable ({e.strerror or first_line(e)})") from None


def remove_quietly(path: Path) -> None:
    """Remove ``path`` if it can be: on a read-only mount even removing a file that is not there fails (EROFS)."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


class RunLock:
    """An exclusive ``fcntl.flock`` on a run's lock file, naming its holder (pid, host) inside.

    The kernel drops the lock when the holding process dies, however it dies, so a SIGKILLed or
    requeued trainer never leaves a stale lock behind; a second trainer on a live run is refused.
    """

    def __init__(self, path: Path, *, refused=None):
        """``refused(path, holder)``: the RunFault a second taker meets (default: the run is in use by a trainer)."""
        self.path = Path(path)
        self.file = None
        self.refused = refused or in_use

    def __enter__(self) -> RunLock:
        file = open(self.path, "a+")
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            holder = describe_holder(file.read())
            file.close()
            raise self.refused(self.path, holder) from None
        file.seek(0)
        file.truncate()
        file.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n")
        file.flush()
        self.file = file
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None


def lock_holder(path: Path) -> str | None:
    """Who holds the lock at ``path`` ("pid 12 on host"), or None when nobody does; creates and writes nothing."""
    try:
        file = open(path)
    except OSError:  # no run there yet, no folder, or a path that cannot be one (too long, a link loop): nobody
        return None  # holds it, and the write probe says what is wrong with it
    with file:
        try:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a shared lock: it conflicts only with a trainer's
        except BlockingIOError:
            return describe_holder(file.read())
        fcntl.flock(file, fcntl.LOCK_UN)
    return None


def check_unlocked(path: Path) -> None:
    """RunFault if another process holds the lock at ``path``; creates and writes nothing, so a refused
    trainer can be turned away before anything (Hydra's own files included) touches a live run."""
    if (holder := lock_holder(path)) is not None:
        raise in_use(Path(path), holder)


def in_use(path: Path, holder: str) -> RunFault:
    return RunFault(f"run_dir {str(path.parent)!r} is in use by another trainer ({holder}); "
                    "wait for it to finish or stop it first")


def describe_holder(text: str) -> str:
    try:
        holder = json.loads(text)
        return f"pid {holder['pid']} on {holder['host']}"
    except (ValueError, KeyError, TypeError):  # the holder has not written its name yet
        return "a process that is starting"
