"""The command line's parser: click's public API, and what every command shares.

typer (0.26 and later) vendors its own copy of click and, from 0.29, coerces every value
through a pydantic ``TypeAdapter`` (~90 ms at every start, with no public way around it); the
commands are declared with click itself instead. What is added here:

* :class:`Group`: parser errors on the one ``Error:`` line every other error is (exit 2, a
  ``--help`` hint), a bare ``ckptinspect`` shows the help (exit 2), a mistyped command name
  gets a suggestion.
* :class:`Command` and :class:`Argument`: positional arguments with help, listed in an
  "Arguments" section, and shown in the usage line by their metavar (``diff [OPTIONS] A B``).
* :class:`Option`: repeatable options and variadic arguments give lists, as the library takes.
* :class:`EnumChoice`: an Enum's values as choices (any case), giving the member.
"""

from __future__ import annotations

import enum
import sys
from typing import Any

import click

__all__ = ["Argument", "Command", "EnumChoice", "Group", "Option", "PlainBadParameter", "usage_error_line"]


def _in_words(choices: list[str]) -> str:
    """``['table', 'json', 'csv']`` -> ``table, json or csv``."""
    return choices[0] if len(choices) == 1 else f"{', '.join(choices[:-1])} or {choices[-1]}"


class PlainBadParameter(click.BadParameter):
    """A bad value whose message is said as given (no ``Invalid value for '--x' / '-x':``)."""

    def format_message(self) -> str:
        return self.message


class EnumChoice(click.Choice):
    """A choice among an Enum's values, in any case; the value is the member. A value that is
    none of them is said in plain words: ``--format must be table, json or csv, not 'yaml'``."""

    def __init__(self, enum_type: type[enum.Enum]):
        self.enum_type = enum_type
        super().__init__([member.value for member in enum_type], case_sensitive=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> enum.Enum:
        if isinstance(value, self.enum_type):
            return value
        try:
            return self.enum_type(super().convert(value, param, ctx))
        except click.BadParameter:
            opts = sorted(getattr(param, "opts", None) or [], key=len)
            name = opts[-1] if opts else (param.name if param is not None else "the value")
            raise PlainBadParameter(f"{name} must be {_in_words(list(self.choices))}, not {value!r}", ctx, param) from None


def _as_list(param: click.Parameter, value: Any) -> Any:
    """A repeatable option's or a variadic argument's values as a list (click gives a tuple)."""
    if isinstance(value, tuple) and (param.multiple or param.nargs == -1):
        return list(value)
    return value


class Option(click.Option):
    """click's option; repeated values come as a list."""

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        return _as_list(self, super().process_value(ctx, value))


class Argument(click.Argument):
    """A positional argument with ``help`` (listed by :class:`Command`), shown in the usage line
    by its metavar alone: ``PATH``, ``[DIR]`` when optional, ``SRC...`` when variadic."""

    def __init__(self, param_decls: list[str], *, help: str | None = None, **kwargs: Any):  # noqa: A002 - click's word
        super().__init__(param_decls, **kwargs)
        self.help = help

    def usage_name(self) -> str:
        name = self.metavar or (self.name or "").upper()
        return (name if self.required else f"[{name}]") + ("..." if self.nargs != 1 else "")

    def get_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [self.usage_name()]

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        value = _as_list(self, super().process_value(ctx, value))
        if value == "" or (isinstance(value, list) and "" in value):  # `ls ''`: not "Error: : no such file"
            raise click.UsageError(f"{self.usage_name().strip('[].')} is empty: give a path", ctx)
        return value


class Command(click.Command):
    """A command whose help lists its arguments ("Arguments") before its options."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(param.usage_name(), (param.help or "") + ("  [required]" if param.required else ""))
                for param in self.get_params(ctx) if isinstance(param, Argument)]
        if rows:
            with formatter.section("Arguments"):
                formatter.write_dl(rows)
        super().format_options(ctx, formatter)


def usage_error_line(e: click.ClickException) -> str:
    """A parser error as the one ``Error:`` line every other error is (the contract's exit 2).
    An unknown option reads ``No such option: --x`` whatever click's version says."""
    if isinstance(e, click.NoSuchOption):
        text = f"No such option: {e.option_name}"
        if e.possibilities:
            text += f". Did you mean {' or '.join(sorted(e.possibilities))}?"
    else:
        text = " ".join(e.format_message().split()).rstrip(".")
    ctx = getattr(e, "ctx", None)
    if ctx is not None and ctx.help_option_names:
        text += f" (see '{ctx.command_path} {ctx.help_option_names[-1]}')"
    return f"Error: {text}"


class Group(click.Group):
    """The app: its commands are :class:`Command`, listed in the order they were declared;
    parser errors on one ``Error:`` line (:func:`usage_error_line`); no arguments at all show
    the help on stdout with exit 2."""

    command_class = Command

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # in the order they were declared, not sorted

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            click.echo(ctx.get_help(), color=ctx.color)
            ctx.exit(2)
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as e:  # "No such command 'lss'" -> "... Did you mean 'ls'?" (click >= 8.3 says it)
            import difflib  # noqa: PLC0415 - a mistyped command only

            matches = difflib.get_close_matches(args[0], list(self.commands)) if args else []
            if matches and e.message.startswith("No such command") and not getattr(e, "possibilities", None):
                e.message = f"{e.message.rstrip('.')}. Did you mean {', '.join(map(repr, matches))}?"
            raise

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # noqa: ANN001, ANN201 - click's
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:  # click's own main, told to hand errors back instead of displaying them
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as e:
            from .render import escape_controls  # noqa: PLC0415 - errors only; the args may hold escapes

            click.echo(escape_controls(usage_error_line(e)), err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("Error: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)
