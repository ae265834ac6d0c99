"""Where the harness keeps files it makes: always outside the source tree."""

import json
import os
import re
import tomllib
from pathlib import Path

from .errors import UsageError


def cache_dir(*parts: str) -> Path:
    """`$AIO_CACHE_DIR`, else `$XDG_CACHE_HOME/aio-examples`, else `~/.cache/aio-examples`."""
    root = os.environ.get("AIO_CACHE_DIR")
    if root:
        base = Path(root)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aio-examples"
    path = base.joinpath(*parts).absolute()    # absolute: ONNX quantization works in a folder of its own
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        said = f"AIO_CACHE_DIR={root!r}" if root else f"the cache folder {str(base)!r}"
        raise UsageError(f"{said} is not a folder this user can write ({exc.strerror}); accepted: a writable folder "
                         "(set AIO_CACHE_DIR)") from None
    return path


def write_json_atomic(path: Path, data, **dump_options) -> None:
    """Write JSON so a reader sees the old file or the new one, never half of one. The temporary name
    is per process: sweeps and multi-instance runs start several processes that write the same caches."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, **dump_options))
    os.replace(tmp, path)


def read_toml(path, flag: str, accepted: str) -> dict:
    """A TOML file a user named with `flag` (`--config`, `--prices`), or a one-line UsageError saying why it
    cannot be read or parsed and what `accepted` is."""
    where = f"{flag} {str(path)!r}"
    try:
        return tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"{where} cannot be read ({exc.strerror or exc}); accepted: {accepted}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{where} is not valid TOML ({exc}); accepted: {accepted}") from None


_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def safe_name(text) -> str:
    """A file name made from data (a model name in a record, a name on the command line) that stays in its
    folder: anything but letters, digits and `._+-` becomes `_`, and it never starts with a dot."""
    name = _UNSAFE.sub("_", str(text)).lstrip(".") or "_"
    return name[:120]
