"""The `kopt` app: one module per command under kopt.cli, registered here.

Command modules import only light modules at the top (typer, pathlib, kopt.errors...);
torch, tilelang and git are imported inside the library calls, so `kopt --help` is instant.
"""

from __future__ import annotations

import functools
import sys
from importlib import import_module

from kopt import bytecode

bytecode.use_cache()  # before the imports below, where the environment writes no bytecode (kopt.bytecode)

import typer  # noqa: E402

from kopt.cli.helpfmt import PANELS, KoptCommand, KoptGroup  # noqa: E402
from kopt.errors import KoptError, UsageError  # noqa: E402

app = typer.Typer(
    name="kopt",
    cls=KoptGroup,
    help="Profile -> edit -> benchmark -> log -> commit loop for TileLang GQA decode kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: command name -> module under kopt.cli exposing `command` (a function) or `app` (a sub-typer), in loop order.
COMMANDS: dict[str, str] = {
    "status": "status",
    "profile": "profile",
    "bench": "bench",
    "verify": "verify",
    "log": "log",
    "commit": "commit",
    "candidates": "candidates",
    "report": "report",
    "plot": "plot",
    "peers": "peers",
    "workloads": "workloads",
    "cases": "cases",
    "trace": "trace",
    "tune": "tune",
    "calibrate": "calibrate",
    "revert": "revert",
    "import": "import_rows",
    "init": "init",
    "doctor": "doctor",
    "e2e": "e2e",
    "compact": "compact",
    "pack": "pack",
    "lab": "lab",
}


#: Commands that run without a workspace (they make one, check the machine, or list kopt's packaged data);
#: every other one outside a workspace says so and exits 2.
NO_WORKSPACE = frozenset({"init", "doctor", "cases", "workloads"})


#: errno values of a workspace that cannot be written (read-only, no permission, disk or quota full).
_UNWRITABLE = {"EROFS": "read-only file system", "EACCES": "permission denied", "EPERM": "operation not permitted",
               "ENOSPC": "no space left on the device", "EDQUOT": "disk quota exceeded"}


def unwritable(e: OSError) -> UsageError | None:
    """A usage error for an OSError that says the workspace cannot be written, else None."""
    import errno

    why = next((w for name, w in _UNWRITABLE.items() if e.errno == getattr(errno, name, None)), None)
    if why is None:
        return None
    where = e.filename or "a file"
    return UsageError(f"cannot write {where}: {why} (the workspace must be writable)")


def guarded(fn, name: str = ""):
    """Wrap a command so domain errors become one stderr line and their exit code, also under CliRunner; a
    command that needs a workspace checks for one first."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            if name and name not in NO_WORKSPACE:
                from kopt.paths import require_workspace

                require_workspace()
            return fn(*args, **kwargs)
        except KoptError as e:
            print(f"kopt: error: {e}", file=sys.stderr)
            raise typer.Exit(e.exit_code) from None
        except OSError as e:
            u = unwritable(e)
            if u is None:
                raise
            print(f"kopt: error: {u}", file=sys.stderr)
            raise typer.Exit(u.exit_code) from None

    return wrapper


def _register(target: typer.Typer, name: str, module: str) -> None:
    try:
        m = import_module(f"kopt.cli.{module}")
    except ModuleNotFoundError as e:  # tests/engine/cli/test_cli.py asserts every entry imports
        if e.name != f"kopt.cli.{module}":
            raise
        print(f"kopt: warning: command module {module} missing", file=sys.stderr)
        return
    if hasattr(m, "app"):
        for info in m.app.registered_commands:
            info.callback = guarded(info.callback, name)
            info.cls = KoptCommand
        target.add_typer(m.app, name=name, cls=KoptGroup, rich_help_panel=PANELS.get(name))
    else:
        target.command(name=name, cls=KoptCommand, rich_help_panel=PANELS.get(name))(guarded(m.command, name))


for _name, _mod in COMMANDS.items():
    _register(app, _name, _mod)


def entry() -> None:
    """The `kopt` command (and `python -m kopt`): main(), then a quick exit when torch is loaded.

    A process that imported torch (the bench parent checks outputs on the GPU) spends 0.3 s or more in
    the interpreter's teardown (CUDA context, profiler, allocator); by the time main() returns every
    file kopt writes is closed (atomic renames, appended ledger lines) and every evaluation child is
    ended, so the exit skips it: streams flushed, then os._exit. $KOPT_FULL_EXIT=1 keeps the normal exit."""
    import os

    try:
        main()
        rc = 0
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    if "torch" in sys.modules and os.environ.get("KOPT_FULL_EXIT") != "1":
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(rc)
    sys.exit(rc)


def pipe_closed() -> int:
    """stdout's reader is gone: point stdout at /dev/null (the interpreter's last flush then says nothing) and
    return 141, the shell's code of a process ended by SIGPIPE."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141


def main() -> None:
    """Console entry point: domain errors become one stderr line and their exit code."""
    import signal

    # SIGTERM unwinds like Ctrl-C, so evaluation children (in their own sessions) are ended too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        # Without standalone mode click *returns* the code of a typer.Exit instead of exiting with it.
        rc = app(standalone_mode=False)
    except KoptError as e:
        print(f"kopt: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        print("kopt: aborted", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print("kopt: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # the reader of stdout left (`kopt status | head -1`): quiet, as the shell's tools
        sys.exit(pipe_closed())
    except OSError as e:  # a workspace that cannot be written is the user's to fix: exit 2, one line
        u = unwritable(e)
        if u is None:
            print(f"kopt: internal error: {type(e).__name__}: {e}", file=sys.stderr)
            sys.exit(3)
        print(f"kopt: error: {u}", file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # click usage errors and anything unexpected: one line, never a traceback
        # Usage errors of click, or of the click copy newer typer vendors, by shape (click may be absent).
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            print(f"kopt: error: {e.format_message()}", file=sys.stderr)
            sys.exit(e.exit_code if e.exit_code else 2)
        print(f"kopt: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(3)
    sys.exit(rc if isinstance(rc, int) else 0)
