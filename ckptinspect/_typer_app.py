"""typer, as the CLI uses it: the one argument parser, with three adjustments that keep every
command's parsing, help and errors typer's own.

* Values without pydantic: :func:`fast_value` coerces the plain values our commands take.
* Help that reads like a man page (``diff [OPTIONS] A B``, ``--atol FLOAT``, flags bare).
* Commands built when looked up (:class:`LazyApp`): ``ckptinspect ls`` builds ``ls`` only.
"""

from __future__ import annotations

import collections.abc
import enum
import re
import sys
from typing import Callable

import typer
import typer.main
from typer._click.exceptions import ClickException, NoArgsIsHelpError
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

__all__ = ["fast_value", "LazyApp", "Command", "Group"]


# -- values without pydantic ------------------------------------------------------------------
# typer (0.2x) coerces every parameter value through a pydantic TypeAdapter, built on first use:
# importing pydantic costs ~100 ms of every command's start. The values our commands take (str,
# int, float, bool, an Enum choice, a list of str) are coerced here when they are plainly of that
# type; anything else, and every value that does not convert, goes to typer's own path, so its
# results and error messages are unchanged (tests/test_ux.py checks both routes agree).
_INT_RE = r"[+-]?\d+"  # patterns compiled on first use (re's cache): most commands take no number
_FLOAT_RE = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_NOT_FAST = object()


def fast_value(param, value):  # noqa: ANN001, ANN201 - a typer parameter and its raw value
    """``value`` coerced as typer would for the simple annotations above, or ``_NOT_FAST``."""
    descriptor = getattr(param, "type_descriptor", None)
    info = getattr(descriptor, "parameter_info", None)
    if info is None or getattr(descriptor, "file_annotation", None) is not None or info.parser is not None \
            or info.min is not None or info.max is not None:
        return _NOT_FAST
    annotation = descriptor.annotation
    if param.multiple or param.nargs == -1:
        if value is None:
            return ()
        if annotation == list[str] and isinstance(value, (list, tuple)) and all(type(v) is str for v in value):
            return list(value)
        return _NOT_FAST
    if value is None:
        return None
    if annotation is str and type(value) is str:
        return value
    if annotation is bool and type(value) is bool:
        return value
    if annotation is int and (type(value) is int or (type(value) is str and re.fullmatch(_INT_RE, value))):
        return int(value)
    if annotation is float and (type(value) in (int, float) or (type(value) is str and re.fullmatch(_FLOAT_RE, value))):
        return float(value)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        if isinstance(value, annotation):
            return value
        if type(value) is str:
            for member in annotation:  # an exact spelling; any other goes to typer (case folding, errors)
                if member.value == value:
                    return member
    return _NOT_FAST


class _FastRuntime:
    """The runtime coercion of one parameter: :func:`fast_value`, else typer's own."""

    def __init__(self, slow: Callable):
        self._slow = slow
        self._param = None

    def coerce(self, value, param, ctx):  # noqa: ANN001, ANN201 - typer's signature
        out = fast_value(param, value)
        if out is not _NOT_FAST:
            return out
        if self._param is None:
            self._param = self._slow()
        return self._param.coerce(value, param=param, ctx=ctx)


def _fast_get_runtime_param(self):  # noqa: ANN001, ANN201 - typer's method, on _Argument/_Option
    """:class:`_FastRuntime` instead of typer's pydantic-built coercion, built on first use."""
    runtime = self.__dict__.get("_fast_runtime")
    if runtime is None:
        runtime = self.__dict__["_fast_runtime"] = _FastRuntime(super(type(self), self).get_runtime_param)
    return runtime


# -- help that reads like a man page: "diff [OPTIONS] A B", "--atol FLOAT", flags bare -------
class _Argument(TyperArgument):
    """A positional argument shown by its metavar alone (``A``), not ``{a}`` and ``<str>``."""

    get_runtime_param = _fast_get_runtime_param

    def display_type_rich(self, ctx):  # noqa: ANN001, ANN201 - typer's signature
        return None

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        return (name if self.required else f"[{name}]") + ("..." if self.nargs != 1 else "")

    def get_usage_pieces(self, ctx):  # noqa: ANN001, ANN201
        return [self._usage_display_name()]


class _Option(TyperOption):
    """An option shown with its metavar (``--atol FLOAT``); a flag shows no type at all."""

    get_runtime_param = _fast_get_runtime_param

    def display_type_rich(self, ctx):  # noqa: ANN001, ANN201
        if self.is_flag or self.count:
            return None
        return self.metavar or super().display_type_rich(ctx)


def _clean(params: list) -> list:
    """Give typer's parameters the clean help display (once; they are cached by the command)."""
    for param in params:
        if type(param) is TyperArgument:
            param.__class__ = _Argument
        elif type(param) is TyperOption:
            param.__class__ = _Option
    return params


class Command(TyperCommand):
    """A command with the clean help display of :class:`_Argument` / :class:`_Option`."""

    def get_params(self, ctx):  # noqa: ANN001, ANN201
        return _clean(super().get_params(ctx))


# -- commands built when looked up ----------------------------------------------------------
# typer turns every registered command into a click command (signature, type hints, one
# parameter object per option) before parsing anything: ~10 ms for our eleven commands at every
# start. The commands are registered with typer as usual (``@app.command``), but their
# ``CommandInfo`` is kept aside and typer's own ``get_command_from_info`` builds a command when
# the group looks it up: ``ckptinspect ls`` builds ``ls`` only; help and ``group.commands``
# build them all. Parsing, help and errors stay typer's.
_COMMAND_INFOS: dict = {}  # command name -> typer CommandInfo, in registration order
_BUILD: dict = {"pretty_exceptions_short": True, "rich_markup_mode": None}  # the app's, for typer's builder


class _LazyCommands(collections.abc.MutableMapping):
    """A group's ``commands``: name -> click command, built by typer on first access."""

    def __init__(self, infos: dict, built: dict):
        self._infos = infos
        self._built = dict(built)

    def __getitem__(self, name: str):  # noqa: ANN204
        command = self._built.get(name)
        if command is None:
            info = self._infos[name]  # KeyError for an unknown name, as a dict
            command = self._built[name] = typer.main.get_command_from_info(info, **_BUILD)
        return command

    def __setitem__(self, name: str, command) -> None:  # noqa: ANN001
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        self._built.pop(name, None)
        self._infos.pop(name, None)

    def __iter__(self):  # noqa: ANN204
        return iter({**dict.fromkeys(self._infos), **dict.fromkeys(self._built)})

    def __len__(self) -> int:
        return len(set(self._infos) | set(self._built))

    def __contains__(self, name: object) -> bool:
        return name in self._infos or name in self._built


def usage_error_line(e: ClickException) -> str:
    """A parser error as the one ``Error:`` line every other error is (the contract's exit 2):
    typer's own display is a usage line, a hint and a framed message over five lines."""
    text = " ".join(e.format_message().split()).rstrip(".")
    ctx = getattr(e, "ctx", None)
    if ctx is not None and ctx.help_option_names:
        text += f" (see '{ctx.command_path} {ctx.help_option_names[-1]}')"
    return f"Error: {text}"


class Group(TyperGroup):
    """The app's group: commands looked up in :class:`_LazyCommands`, clean help display,
    parser errors on one ``Error:`` line (:func:`usage_error_line`)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # noqa: ANN001, ANN201
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:  # typer's own main, told to hand errors back instead of displaying them
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except NoArgsIsHelpError as e:  # `ckptinspect` alone: the help, as typer shows it
            e.show()
            sys.exit(e.exit_code)
        except ClickException as e:
            from .render import escape_controls  # noqa: PLC0415 - errors only; the args may hold escapes

            sys.stderr.write(escape_controls(usage_error_line(e)) + "\n")
            sys.exit(e.exit_code)
        except typer.Abort:
            sys.stderr.write("Error: aborted\n")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.commands = _LazyCommands(_COMMAND_INFOS, self.commands)

    def get_params(self, ctx):  # noqa: ANN001, ANN201
        return _clean(super().get_params(ctx))

    def list_commands(self, ctx):  # noqa: ANN001, ANN201
        return list(self.commands)  # names, in registration order, without building the commands


class LazyApp(typer.Typer):
    """``typer.Typer`` whose commands are built when looked up (see :class:`_LazyCommands`);
    one per process (its commands are registered module-wide)."""

    def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003 - typer's
        super().__init__(*args, **kwargs)
        _BUILD.update(pretty_exceptions_short=self.pretty_exceptions_short, rich_markup_mode=self.rich_markup_mode)

    def command(self, name: str, **kwargs):  # noqa: ANN003, ANN201 - typer's decorator
        register = super().command(name, **kwargs)

        def decorator(fn: Callable) -> Callable:
            register(fn)
            _COMMAND_INFOS[name] = self.registered_commands.pop()  # kept aside: built on lookup
            return fn

        return decorator
