"""The errors ckptinspect raises.

Every error derives from :class:`CkptError`, so a caller can catch one type. The specific
errors also derive from the builtin a caller would already catch (``FileNotFoundError``,
``ValueError``, ``FileExistsError``), as orbax does with ``StepNotFoundError``.

Messages name the file and the problem on one line; the CLI prints them as ``Error: ...``.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = [
    "CkptError",
    "CheckpointNotFoundError",
    "NotACheckpointError",
    "CorruptCheckpointError",
    "UnallocatedDataError",
    "UnsafeFileError",
    "OutputExistsError",
    "OutputWriteError",
    "UsageError",
    "TransplantError",
    "VerificationError",
    "MissingDependencyError",
    "one_line",
]


class CkptError(Exception):
    """Base class of every error raised by ckptinspect."""


class CheckpointNotFoundError(CkptError, FileNotFoundError):
    """A path, a checkpoint, one of its shards, or a variable does not exist."""


class NotACheckpointError(CkptError, ValueError):
    """The path exists but is not a checkpoint (or is a part of one, such as a data shard)."""


class CorruptCheckpointError(CkptError, ValueError):
    """The file looks like a checkpoint but its bytes are damaged or truncated."""


class UnallocatedDataError(CorruptCheckpointError):
    """A dataset declares a shape but no data was ever written for it (HDF5 storage not
    allocated): reading it would only give its fill value. Raised instead of materialising it.

    Attributes:
        key: The dataset.
        fill_value: The value every element would read as (a numpy scalar), or None.
    """

    def __init__(self, message: str, key: str = "", fill_value: Any = None):
        super().__init__(message)
        self.key = key
        self.fill_value = fill_value


class UnsafeFileError(CkptError, ValueError):
    """A file asks for something unsafe to follow (external links, zip bombs, path traversal)."""


class OutputExistsError(CkptError, FileExistsError):
    """A write would overwrite an existing output and ``force`` was not given."""


class OutputWriteError(CkptError, OSError):
    """An output could not be written (a full disk); nothing was left under its name."""


class UsageError(CkptError, ValueError):
    """The arguments of a call do not fit together."""


class MissingDependencyError(CkptError, ImportError):
    """What was asked needs an optional dependency that is not installed (TensorFlow for
    ``transplant``, ``train`` and ``--builder`` models); the message names the extra to install."""


class TransplantError(CkptError, ValueError):
    """A transplant found problems (strict) or a value did not arrive on every replica.

    Attributes:
        problems: Every problem, one string each.
        report: The plan (a ``TransplantReport``), when one was made.
    """

    def __init__(self, message: str, problems: Sequence[str] = (), report: Any = None):
        super().__init__(message)
        self.problems = list(problems)
        self.report = report


class VerificationError(CkptError):
    """What was written or assigned did not read back identical to its source: a written
    output (``extract``, ``transplant``) or a value on some replica after assignment. Nothing
    is left behind when an output fails its read-back.

    Attributes:
        problems: Every difference found, one string each.
    """

    def __init__(self, message: str, problems: Sequence[str] = ()):
        super().__init__(message)
        self.problems = list(problems)


def one_line(e: BaseException) -> str:
    """An exception's message for one of our messages: its whitespace (newlines included)
    collapsed to single spaces, or its type's name when it has no message, so that
    ``f"{path}: cannot read: {one_line(e)}"`` stays on one line and never ends empty."""
    return " ".join(str(e).split()) or type(e).__name__
