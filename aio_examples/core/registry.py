"""Looking a name up in one of the registries (models, backends, datasets), with the error a user reads."""

from .errors import UsageError


def lookup(table: dict, name: str, what: str, also: tuple = ()):
    """`table[name]`, or a one-line UsageError naming the bad value and every accepted one."""
    try:
        return table[name]
    except (KeyError, TypeError):
        raise UsageError(f"{what} {name!r} is unknown; accepted: {', '.join([*table, *also])}") from None
