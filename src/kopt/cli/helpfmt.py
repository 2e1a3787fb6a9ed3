"""How `kopt --help` reads: commands in loop order under a few panels, values named by what they hold (IDS, PATH,
N) instead of type tags, arguments in the usage line as NAME / [NAME], and help text printed as written (a `[iter N]`
in a docstring is text, not a style tag the help renderer drops)."""

from __future__ import annotations

from typer.core import TyperArgument, TyperCommand, TyperGroup

#: The help panel of each command, in the order `kopt --help` lists them (the loop first).
PANELS: dict[str, str] = {
    "status": "The loop", "profile": "The loop", "bench": "The loop", "verify": "The loop", "log": "The loop",
    "commit": "The loop",
    "candidates": "Look and compare", "report": "Look and compare", "plot": "Look and compare",
    "peers": "Look and compare", "workloads": "Look and compare", "cases": "Look and compare",
    "trace": "Look and compare", "e2e": "Look and compare",
    "tune": "Tune and calibrate", "calibrate": "Tune and calibrate",
    "revert": "Workspace", "import": "Workspace", "init": "Workspace", "doctor": "Workspace",
    "compact": "Workspace", "pack": "Workspace",
    "lab": "Research",
}
#: Value names by option (a few say what the value is better than its type does).
_BY_NAME = {"case": "IDS", "config": "JSON", "device": "DEVICE", "gpus": "N|all", "message": "TEXT"}
#: Value names by the option's Python type.
_BY_TYPE = {"str": "TEXT", "int": "N", "float": "NUM"}


def _type_name(p) -> str:
    d = getattr(p, "type_descriptor", None)
    if d is None:
        return "VALUE"
    if d.is_path:
        return "PATH"
    name = d.ranged_type_name if d.is_ranged else getattr(d.annotation, "__name__", "")
    return _BY_TYPE.get(str(name).lower(), "VALUE")


def _plain(cmd) -> None:
    """Escape the help of a command and of its parameters once: kopt's help texts hold no markup, and a bracketed
    word in them (`[iter N] DESC`, `[NAME]`) would otherwise be read as a style tag and vanish."""
    from rich.markup import escape

    if getattr(cmd, "_kopt_plain", False):
        return
    cmd._kopt_plain = True
    for obj in (cmd, *getattr(cmd, "params", ())):
        for attr in ("help", "short_help"):
            text = getattr(obj, attr, None)
            if isinstance(text, str):
                setattr(obj, attr, escape(text))


def _no_type(ctx=None) -> None:
    return None


def _help_option(opt):
    if opt is not None:
        opt.metavar = ""
    return opt


def _name_values(params) -> None:
    for p in params:
        if getattr(p, "is_flag", False) or getattr(p, "count", False):
            p.metavar = ""  # a flag takes no value: no type tag beside it
        elif isinstance(p, TyperArgument):
            p.metavar = (p.name or "arg").upper()
            p.display_type_rich = _no_type  # the name says it; no `<path>` tag beside it
        elif p.metavar is None:
            p.metavar = _BY_NAME.get(p.name or "") or _type_name(p)


class KoptCommand(TyperCommand):
    """A command whose help names values, not types."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _name_values(self.params)

    def format_help(self, ctx, formatter):
        """The help, its text escaped first (_plain): only when help is shown, so no other run imports rich."""
        _plain(self)
        return super().format_help(ctx, formatter)

    def get_help_option(self, ctx):
        """--help, without a type tag."""
        return _help_option(super().get_help_option(ctx))

    def collect_usage_pieces(self, ctx) -> list[str]:
        """[OPTIONS] (--help at least) then each argument as NAME (required) or [NAME]."""
        options = not self.params or any(not isinstance(p, TyperArgument) for p in self.params)
        pieces = [self.options_metavar] if options else []
        for p in self.params:
            if isinstance(p, TyperArgument):
                pieces.append(p.metavar if p.required else f"[{p.metavar}]")
        return pieces


class KoptGroup(TyperGroup):
    """The top-level group: commands in PANELS order."""

    def format_help(self, ctx, formatter):
        """The help, its text and the listed commands' escaped first (_plain), as KoptCommand's."""
        for cmd in (self, *(self.get_command(ctx, n) for n in self.list_commands(ctx))):
            if cmd is not None:
                _plain(cmd)
        return super().format_help(ctx, formatter)

    def get_help_option(self, ctx):
        """--help, without a type tag."""
        return _help_option(super().get_help_option(ctx))

    def list_commands(self, ctx) -> list[str]:
        """Commands in loop order (PANELS), any other after them."""
        order = list(PANELS)
        return sorted(self.commands, key=lambda n: order.index(n) if n in order else len(order))
