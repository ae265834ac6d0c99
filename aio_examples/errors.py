"""Typed errors. Library code raises these; only the CLI turns them into exit codes."""


class AioError(Exception):
    """Base class of every error the harness raises on purpose."""


class UsageError(AioError):
    """Bad input from the user (a value, a file, a flag). The CLI exits with 2."""


class UnsupportedError(AioError):
    """A backend/precision/model combination that cannot run; recorded as `unsupported`."""


class SetupError(AioError):
    """The installation is not usable (for example torchvision cannot be made to load)."""
