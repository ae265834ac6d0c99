"""Where the harness keeps files it makes: always outside the source tree."""

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """`$AIO_CACHE_DIR`, else `$XDG_CACHE_HOME/aio-examples`, else `~/.cache/aio-examples`."""
    root = os.environ.get("AIO_CACHE_DIR")
    if root:
        base = Path(root)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aio-examples"
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
