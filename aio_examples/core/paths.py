"""Where the harness keeps files it makes: always outside the source tree."""

import json
import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """`$AIO_CACHE_DIR`, else `$XDG_CACHE_HOME/aio-examples`, else `~/.cache/aio-examples`."""
    root = os.environ.get("AIO_CACHE_DIR")
    if root:
        base = Path(root)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aio-examples"
    path = base.joinpath(*parts).absolute()    # absolute: ONNX quantization works in a folder of its own
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json_atomic(path: Path, data, **dump_options) -> None:
    """Write JSON so a reader sees the old file or the new one, never half of one. The temporary name
    is per process: sweeps and multi-instance runs start several processes that write the same caches."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, **dump_options))
    os.replace(tmp, path)
