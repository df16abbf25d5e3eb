"""The front door every command runs behind: each expected failure is one line, never a traceback.

Bad input (a flag, a prompt, a checkpoint, a folder) is one line on stderr and exit code 2;
Ctrl-C at any moment, even while torch is still importing, is exit code 130; a reader that goes
away early (`| head`) ends the run quietly with 141, as SIGPIPE would; a command started with
stdout closed (`>&-`) is one line and exit code 2 before it runs, since its output could go
nowhere. A traceback means a bug.

It knows no command: `python -m minispec` passes it the command table's choice (cli.py), and a
module run on its own (`python -m minispec.commands.build_index`, `python -m benchmarks`) passes
its own `main`. So it sits below every command, and no command imports the table above it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
from typing import Callable

from minispec.commands.args import fail

EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141  # 128 + SIGINT, 128 + SIGPIPE: what a shell shows
Command = Callable[[list[str]], int]  # a command's main: its arguments in, its exit code out


def importing(name: str) -> bool:
    """Whether module `name` is being imported at this moment (importlib marks its spec)."""
    return bool(getattr(getattr(sys.modules.get(name), "__spec__", None), "_initializing", False))


class CtrlC:
    """Ctrl-C raises KeyboardInterrupt as usual, and is also remembered: a library that catches
    the interrupt and raises something else instead (an import machinery error, a worker pool's
    failure) must still end as an interrupt, not as a traceback. A second Ctrl-C is ignored, so
    that it cannot break into the clean-up of the first (an atomic save, the exit itself).

    While torch itself is being imported, an exception cannot be raised safely: its C++ start-up
    may abort the process with a C++ stack trace, or CPython records the interrupt as unhandled
    and kills the process with SIGINT at exit. So the process ends on the spot then, which is
    safe: nothing has been written yet (docs/reliability.md).
    """

    pressed = False

    @staticmethod
    def handler(signum: int, frame: object) -> None:
        CtrlC.pressed = True
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if importing("torch"):
            os._exit(EXIT_INTERRUPTED)
        raise KeyboardInterrupt


def unwritable_stdout() -> OSError | None:
    """Flush stdout; when that fails (the reader closed the pipe, the disk is full), point the
    file descriptor at /dev/null so the interpreter's own flush at exit cannot fail again with a
    traceback (the recipe in Python's `signal` documentation), and return the error."""
    try:
        sys.stdout.flush()
        return None
    except OSError as exc:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return exc


def one_line(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return f"out of memory {exc}".strip()
    if isinstance(exc, OSError) and exc.strerror:  # "[Errno 28] ..." says nothing more to a user
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__


def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {' '.join(str(message).split())}", file=sys.stderr)


def run(command: Command, argv: list[str] | None = None, program: bool | None = None) -> int:
    """Run `command` behind the front door on `argv`, by default the process's arguments.
    `program`: whether this process is the command rather than a Python caller's (by default,
    when argv is None), which decides how Ctrl-C is left at the end."""
    program = argv is None if program is None else program
    owns_signals = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, CtrlC.handler) if owns_signals else None
    CtrlC.pressed = False
    shown = warnings.showwarning
    warnings.showwarning = one_line_warning
    closed = [name for name in ("stdout", "stderr") if getattr(sys, name) is None]
    for name in closed:  # started with the stream closed (`>&-`): write nowhere
        setattr(sys, name, open(os.devnull, "w"))
    problem: BaseException | None = None
    try:
        if "stdout" in closed:  # the output would be lost: say so (on stderr, if it is open)
            return fail("stdout is closed: the output would be lost; redirect it to a file instead")
        code = command(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except SystemExit:
        raise  # argparse's verdict (--help, or a bad flag already reported in one line)
    except BaseException as exc:
        if CtrlC.pressed:  # whatever the interrupt turned into on its way up
            return EXIT_INTERRUPTED
        if not isinstance(exc, (ValueError, OSError, MemoryError)):  # CheckpointError: ValueError
            raise  # a bug: the traceback is what a report needs
        code, problem = 2, exc
    finally:
        warnings.showwarning = shown
        if owns_signals:
            # The program is done: a late Ctrl-C must not interrupt the interpreter's exit.
            restore = signal.default_int_handler if previous is None else previous  # None: set in C
            signal.signal(signal.SIGINT, signal.SIG_IGN if program else restore)
    unwritable = unwritable_stdout()
    if isinstance(problem, BrokenPipeError) or isinstance(unwritable, BrokenPipeError):
        return EXIT_BROKEN_PIPE  # the reader has gone (`| head`): no one is left to tell
    if unwritable is not None and (problem is None or isinstance(problem, OSError)):
        problem = OSError(f"cannot write the output: {one_line(unwritable)}")
    return fail(one_line(problem)) if problem is not None else code
