"""Typed errors. Library code raises these; only the CLI turns them into exit codes."""

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
PROG = "aio-examples"               # the command's name, which starts its one-line errors: "aio-examples: error: ..."


class AioError(Exception):
    """Base class of every error the harness raises on purpose."""


class UsageError(AioError):
    """Bad input from the user (a value, a file, a flag). The CLI exits with 2."""


class UnsupportedError(AioError):
    """A backend/precision/model combination that cannot run; recorded as `unsupported`."""


class SetupError(AioError):
    """The installation is not usable (for example torchvision cannot be made to load)."""


def short_error(exc: BaseException, limit: int = 300) -> str:
    """`Type: first line` of an error, or `Type <- RootType: first line` of its root cause when it wraps one
    (the exporters wrap the error that says what went wrong)."""
    def first_line(e):
        text = _ANSI.sub("", str(e)).strip()
        return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"

    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    text = first_line(exc) if root is exc else f"{type(exc).__name__} <- {first_line(root)}"
    return text[:limit]
