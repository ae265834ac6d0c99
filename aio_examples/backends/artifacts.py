"""On-disk artifacts (exported ONNX files, OpenVINO IR, tuning decisions), keyed so nothing stale is reused.

A key covers the model name, the input shapes and dtypes, the precision, the weights' digest and
the library versions that made the artifact; a changed model or shape gets a new folder. A file an
artifact is made of carries its sha256 in the artifact's metadata (`digests`), checked when the artifact
is reused (`intact`): a damaged one (a full disk, a bad sector, a hand edit) is made again once, not
recorded as unsupported for ever.
"""

import hashlib
import json
from pathlib import Path

from ..core.paths import cache_dir, safe_name


def weights_digest(module) -> str:
    """sha256 over every parameter and buffer (names, dtypes, shapes, bytes) of a module; a model that is a file
    (a user's ONNX graph) holds its weights there: its file's digest."""
    import torch

    if isinstance(getattr(module, "digest", None), str):
        return module.digest
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        if not isinstance(tensor, torch.Tensor):
            continue
        t = tensor.detach().contiguous().cpu()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def describe_inputs(inputs) -> list:
    """Shapes and dtypes of (nested) inputs, for keys and records."""
    if isinstance(inputs, (list, tuple)):
        return [describe_inputs(i) for i in inputs]
    if hasattr(inputs, "shape") and hasattr(inputs, "dtype"):
        return [list(inputs.shape), str(inputs.dtype)]
    return repr(inputs)


def key(**parts) -> str:
    """A short stable digest of JSON-able parts."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def artifact_dir(kind: str, model_name: str, **parts) -> Path:
    """`<cache>/<kind>/<model>-<key>/`, created; a `key.json` inside says what the key covers."""
    digest = key(model=model_name, **parts)
    path = cache_dir(kind, f"{safe_name(model_name)}-{digest}")
    meta = path / "key.json"
    if not meta.exists():
        meta.write_text(json.dumps({"model": model_name, **parts}, sort_keys=True, indent=1, default=str))
    return path


def digests(folder: Path, names) -> dict:
    """name -> sha256 of each file, for an artifact's metadata."""
    out = {}
    for name in names:
        digest = hashlib.sha256()
        with open(Path(folder) / name, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        out[name] = digest.hexdigest()
    return out


def intact(folder: Path, recorded: dict | None) -> bool:
    """Whether every file the metadata names is there with the digest it was written with. Metadata without
    digests (written before they were kept) cannot vouch for its files: not intact, made again once."""
    if not recorded:
        return False
    try:
        return digests(folder, recorded) == recorded
    except OSError:
        return False
