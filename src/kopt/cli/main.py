"""The `kopt` app: one module per command under kopt.cli, registered here.

Command modules import only light modules at the top (typer, pathlib, kopt.errors...);
torch, tilelang and git are imported inside the library calls, so `kopt --help` is instant.
"""

from __future__ import annotations

import sys
from importlib import import_module

import typer

from kopt.errors import KoptError

app = typer.Typer(
    name="kopt",
    help="Profile -> edit -> benchmark -> log -> commit loop for TileLang GQA decode kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: command name -> module under kopt.cli exposing `command` (a function) or `app` (a sub-typer).
COMMANDS: dict[str, str] = {
    "bench": "bench",
    "cases": "cases",
    "doctor": "doctor",
}

for _name, _mod in COMMANDS.items():
    _m = import_module(f"kopt.cli.{_mod}")
    if hasattr(_m, "app"):
        app.add_typer(_m.app, name=_name)
    else:
        app.command(name=_name)(_m.command)


def main() -> None:
    """Console entry point: domain errors become one stderr line and their exit code."""
    try:
        app(standalone_mode=False)
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
    except Exception as e:  # click usage errors and anything unexpected: one line, never a traceback
        import click

        if isinstance(e, click.exceptions.ClickException):
            print(f"kopt: error: {e.format_message()}", file=sys.stderr)
            sys.exit(e.exit_code if e.exit_code else 2)
        print(f"kopt: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(3)
