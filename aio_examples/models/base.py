"""What a zoo entry is: how to build the model, make its inputs and count its work."""

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import UsageError

# Tasks benchmarked as generation (a prompt prefilled, then tokens decoded one by one over a KV cache): the
# generation scenario, weight-only int4, and no ONNX Runtime / OpenVINO / TorchScript (models/nlp.py, speech.py)
GENERATION_TASKS = ("text-generation", "speech-recognition", "summarization")
VISION_ACTIVATIONS = 8     # widest feature maps / input (a ResNet's first stage: 64 x 112^2 over 3 x 224^2 is 5.3)
HIDDEN = 768               # the zoo's base-size transformers


def is_generator(task: str) -> bool:
    """Whether models of `task` generate tokens (GENERATION_TASKS): a text generator, BART, Whisper."""
    return task in GENERATION_TASKS


@dataclass(frozen=True)
class ModelSpec:
    """One zoo entry. Subclasses per model family implement `_build_module` and `example_inputs`."""

    name: str
    task: str                       # e.g. image-classification, object-detection, question-answering
    task_unit: str                  # what throughput counts: images, sequences, tokens
    default_shape: dict             # e.g. {"input_size": 224} or {"seq_len": 384}
    unsupported_backends: dict = field(default_factory=dict)   # backend -> reason
    config_overrides: tuple = ()    # (key, value) pairs changing the architecture's config (--config-override)

    @property
    def family(self) -> str:
        return "nlp" if "seq_len" in self.default_shape else "vision"

    def shape(self, **overrides) -> dict:
        """Default shape with the user's overrides (None means keep the default), validated."""
        shape = dict(self.default_shape)
        for key, value in overrides.items():
            if value is None:
                continue
            if key not in shape:
                flag = "--" + key.replace("_", "-")
                accepted = ", ".join("--" + k.replace("_", "-") for k in shape) or "none (its shape is the batch size)"
                raise UsageError(f"{flag} does not apply to {self.name} ({self.task}); accepted: {accepted}")
            if int(value) < 1:
                raise UsageError(f"--{key.replace('_', '-')} {value} is invalid; accepted: a whole number >= 1")
            shape[key] = int(value)
        self.check_shape(shape)
        return shape

    def smoke_shape(self) -> dict:
        """A small shape that still exercises the whole model: for support checks and tests."""
        return dict(self.default_shape)

    def check_shape(self, shape: dict) -> None:
        """Raise UsageError for shapes this model cannot take."""

    def build(self, weights: str | None = None, model_dir: str | None = None, shape: dict | None = None):
        """The model in eval mode: random weights, a state-dict file, or a local model folder."""
        import torch

        torch.manual_seed(0)   # random weights are the same in every process
        if model_dir is not None:
            module = self._from_dir(Path(model_dir))
        else:
            module = self._build_module(shape or self.default_shape)
        if weights is not None:
            load_state_dict_file(self._weights_target(module), weights)
        elif model_dir is None:
            self._initialise(module.eval(), shape or self.default_shape)
        return module.eval()

    random_weights = "random"           # how the random weights are made: recorded as the result's `weights`

    def _initialise(self, module, shape: dict) -> None:
        """Adjust freshly built random weights (a family whose default initialisation needs it)."""

    def _build_module(self, shape: dict):
        raise NotImplementedError

    def _from_dir(self, path: Path):
        raise UsageError(f"--model-dir is for Hugging Face models; {self.name} loads weights with --weights FILE")

    def _weights_target(self, module):
        """The module a state-dict file is loaded into (the wrapped library model)."""
        return getattr(module, "model", module)

    def example_inputs(self, batch_size: int, shape: dict, module) -> tuple:
        raise NotImplementedError

    def calibration_inputs(self, batch_size: int, shape: dict, module, n: int) -> list[tuple]:
        """`n` input tuples like the example inputs, for static int8 calibration."""
        return [self.example_inputs(batch_size, shape, module)] * n

    def task_size(self, batch_size: int, shape: dict) -> int:
        """Work units (task_unit) one pass does."""
        return batch_size

    def make_pass(self, prepared, shape: dict):
        """A zero-argument callable doing one pass of the prepared model."""
        fn, inputs = prepared.fn, prepared.inputs
        return lambda: fn(*inputs)

    def checked_output(self, one_pass, output, reference):
        """What the output check compares with eager fp32's: the first pass's output, post-processed (a
        generator's adds the logits of steps fed the reference's own tokens, see nlp.py)."""
        return self.postprocess(output)

    def postprocess(self, output):
        """What output checks and dataset scores read, from what one pass of a prepared model returns (any
        backend's form): the same by default; a YOLO detector's NMS, which runs outside the backend and the timed
        pass (yolo.py)."""
        return output

    def collate(self, samples: list, shape: dict) -> tuple:
        """A dataset's preprocessed samples (`preprocess`'s tensors) as one batch of model inputs: stacked by
        default; torchvision's detectors pad images of different sizes into one tensor (vision.py)."""
        import torch

        return (torch.stack(samples),)

    def reference_protocol(self, shape: dict) -> dict | None:
        """The reference evaluation this family's preprocessing and post-processing follow at `shape`, in the form
        of `Dataset.protocol` (torchvision's, Ultralytics' val); None when there is none."""
        return None

    def weight_bytes(self) -> int:
        """Bytes of the built model's fp32 weights, where counting them costs nothing (0: not counted; a
        vision model's are small beside its activations)."""
        return 0

    def memory_estimate(self, batch_size: int, shape: dict) -> int:
        """Bytes the built model and a pass need at most, roughly: a batch or shape far past what the machine
        holds is refused from this before anything is allocated. From the family's inputs and widest
        activations; 0 when unknown (a user's own module). Each configuration's own copy of the weights is
        the backend's to estimate (Backend.memory_estimate)."""
        side = shape.get("input_size")
        if side:                    # images: the widest feature maps hold a few times the input, in fp32
            return batch_size * 3 * side * side * 4 * VISION_ACTIVATIONS
        seq = shape.get("seq_len", 0) + shape.get("new_tokens", 0)
        # transformers: hidden states and the 4x feed-forward, plus one layer's attention scores (12 heads)
        return batch_size * (seq * HIDDEN * 4 * 16 + 12 * seq * seq * 4) if seq else 0

    def input_shape(self, batch_size: int, shape: dict) -> dict:
        """The input shape recorded in results, with any config override (part of the configuration key; a tuple
        as the list it reads back as from JSON)."""
        return {"batch_size": batch_size, **shape,
                **{f"config.{k}": list(v) if isinstance(v, tuple) else v for k, v in self.config_overrides}}

    config_name = ""        # the architecture's config, as messages name it ("": no config to override)

    def config_dict(self) -> dict:
        """The architecture's config with this entry's overrides, as a dict; ValueError or TypeError where the
        library refuses them. Only for entries with a `config_name`."""
        raise NotImplementedError

    def with_config(self, overrides: list[str] | None) -> "ModelSpec":
        """This entry with `KEY=VALUE` overrides of its architecture's config (a quick look at any shape:
        `num_hidden_layers=2`): the key must be a field of the config, the value of its type (JSON literals: 2,
        0.5, true, "text", [32, 64])."""
        if not overrides:
            return self
        if not self.config_name:
            raise UsageError(f"--config-override does not apply to {self.name}; accepted: the transformers and "
                             "diffusers models (a config to override)")
        import dataclasses
        import json

        config, parsed = self.config_dict(), {}
        for item in overrides:
            key, eq, text = item.partition("=")
            if not eq or not key:
                raise UsageError(f"--config-override {item!r} is invalid; accepted: KEY=VALUE")
            if key not in config:
                raise UsageError(f"--config-override {item!r}: {self.config_name} has no {key!r}; accepted: one of "
                                 f"its keys, e.g. {', '.join(sorted(k for k in config if 'layers' in k or 'size' in k)[:6])}")
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                value = text
            default = config[key]
            if isinstance(default, tuple) and isinstance(value, list):
                value = tuple(value)        # a JSON array where the config holds a tuple (diffusers' block widths)
            if default is not None and not (type(value) is type(default)
                                            or (isinstance(default, float) and type(value) is int)):
                raise UsageError(f"--config-override {item!r}: {key} takes a {type(default).__name__} "
                                 f"(its default is {default!r}); accepted: KEY=VALUE of that type")
            parsed[key] = value
        spec = dataclasses.replace(self, config_overrides=tuple(sorted(parsed.items())))
        try:
            spec.config_dict()
        except (ValueError, TypeError) as exc:
            raise UsageError(f"--config-override {' '.join(overrides)}: {self.config_name} refuses it "
                             f"({str(exc).splitlines()[0][:200]})") from None
        return spec


def load_state_dict_file(module, path: str) -> None:
    """Load a PyTorch state-dict file (optionally under a "state_dict" or "model" key) strictly."""
    import torch

    file = Path(path)
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageError(f"--weights {path!r} does not exist; accepted: a readable PyTorch state-dict file") from None
    except Exception as exc:  # noqa: BLE001  (torch.load on an arbitrary file raises almost anything: KeyError...)
        raise UsageError(f"--weights {path!r} is not a readable PyTorch state-dict file ({exc.__class__.__name__})") from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise UsageError(f"--weights {path!r} holds a {type(state).__name__}, not a state dict")
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[1:2] or [str(exc)]
        raise UsageError(f"--weights {path!r} does not fit {type(module).__name__}: {first[0].strip()}") from None


def file_sha256(path: str, digest=None) -> str:
    digest = digest or hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def folder_sha256(path: str) -> str:
    """sha256 over a model folder's files (names and bytes, in name order): config, weights, tokenizer."""
    digest = hashlib.sha256()
    for file in sorted(p for p in Path(path).iterdir() if p.is_file()):
        digest.update(file.name.encode() + b"\0")
        file_sha256(str(file), digest)
    return digest.hexdigest()


def unit_variance(module, inputs: tuple) -> None:
    """Rescale every convolution, linear layer and embedding bag so its output on `inputs` has unit variance, in
    one pass.

    Default initialisations are made for training, where batch norm or the optimiser rescales each layer; in eval
    mode nothing does. Through a deep stack of depthwise convolutions the signal vanishes (mobilenet_v2's logits:
    std 1e-10, efficientnet_b0's 1e-15 here), below what fp16 and int8 represent; a DLRM's click logit barely
    moves from its bias (std 0.03 with MLPerf's initialisation). Either way every reduced-precision output check
    would judge the missing signal, not the precision. A zero-initialised layer (ViT's head) first gets random
    weights. Deterministic: fixed inputs.
    """
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(0)
    done = set()

    def rescale(layer, args, out):
        if layer in done or not torch.is_tensor(out):
            return None
        done.add(layer)
        if not layer.weight.any():
            fan_in = layer.weight[0].numel()
            layer.weight.normal_(0.0, fan_in ** -0.5, generator=gen)
            out = layer.forward(*args)           # forward, not __call__: no hook again
        std = float(out.float().std())
        if not 0 < std < float("inf"):
            return None
        layer.weight.div_(std)
        if getattr(layer, "bias", None) is not None:
            layer.bias.div_(std)
        return out / std

    hooks = [m.register_forward_hook(rescale) for m in module.modules()
             if isinstance(m, (nn.Conv2d, nn.Linear, nn.EmbeddingBag)) and m.weight is not None
             and m.weight.requires_grad]      # fixed weights (YOLO's DFL integral) are no initialisation
    try:
        with torch.no_grad():
            module(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
