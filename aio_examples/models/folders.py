"""A local Hugging Face folder of any architecture, benchmarked like a zoo entry (`aio-examples run --model-dir
DIR` without a zoo name): the architecture from its config.json, the task from its head, the inputs from the
tokenizer or image processor in it (random token ids or images when it has none). Named after the folder."""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..core.errors import UsageError
from .base import ModelSpec
from .nlp import CausalLM, Encoder, load_transformers
from .vision import _images

# The head's suffix in config.json's `architectures` -> (task, transformers auto class); the first that matches
HEADS = (
    ("ForQuestionAnswering", "question-answering", "AutoModelForQuestionAnswering"),
    ("ForSequenceClassification", "text-classification", "AutoModelForSequenceClassification"),
    ("ForMaskedLM", "fill-mask", "AutoModelForMaskedLM"),
    ("ForCausalLM", "text-generation", "AutoModelForCausalLM"),
    ("LMHeadModel", "text-generation", "AutoModelForCausalLM"),
    ("ForImageClassification", "image-classification", "AutoModelForImageClassification"),
)
TEXT_SEQ_LEN, PROMPT_LEN, NEW_TOKENS = 128, 128, 32      # default shapes, like the zoo's base-size entries


def folder_spec(path: str) -> ModelSpec:
    """The spec of the model in a local Hugging Face folder; one line when the folder is not one we can run."""
    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise UsageError(f"--model-dir {path!r} has no config.json; accepted: a local Hugging Face model folder")
    try:
        config = json.loads(config_file.read_text())
        architecture = config["architectures"][0]
        model_type = config["model_type"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise UsageError(f"--model-dir {path!r}: its config.json names no architecture and model_type; accepted: "
                         "a folder saved by transformers (save_pretrained)") from None
    head = next((h for h in HEADS if architecture.endswith(h[0])), None)
    if head is None:
        raise UsageError(f"--model-dir {path!r} holds a {architecture}, a head not benchmarked here; accepted: "
                         + ", ".join(f"*{suffix} ({task})" for suffix, task, _ in HEADS))
    _, task, auto_class = head
    configs = load_transformers().CONFIG_MAPPING
    if model_type not in configs:
        raise UsageError(f"--model-dir {path!r}: model_type {model_type!r} is unknown to this transformers; "
                         "accepted: an architecture transformers implements")
    common = {"name": folder.resolve().name, "task": task, "config_class": configs[model_type].__name__,
              "model_class": architecture, "auto_class": auto_class,
              "config_kwargs": tuple((k, v) for k, v in config.items() if k not in ("architectures", "model_type"))}
    if task == "image-classification":
        size = config.get("image_size") or 224
        return ImageFolder(task_unit="images", default_shape={"input_size": size if isinstance(size, int) else size[0]},
                           **common)
    if task == "text-generation":
        return CausalLM(task_unit="tokens", default_shape={"seq_len": PROMPT_LEN, "new_tokens": NEW_TOKENS}, **common)
    limit = config.get("max_position_embeddings") or TEXT_SEQ_LEN
    return Encoder(task_unit="sequences", default_shape={"seq_len": min(TEXT_SEQ_LEN, limit)}, **common)


class ImageLogits(nn.Module):
    """A transformers image classifier returning its logits tensor, as the torchvision classifiers do."""

    def __init__(self, model: nn.Module, mean=None, std=None):
        super().__init__()
        self.model = model
        self.mean, self.std = mean, std

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=False)[0]


@dataclass(frozen=True)
class ImageFolder(Encoder):
    """A transformers image classifier from a folder; images normalised as its image processor says."""

    def check_shape(self, shape):
        if shape["input_size"] < 16:
            raise UsageError(f"--input-size {shape['input_size']} is too small for {self.name}; accepted: >= 16")

    def _from_dir(self, path: Path):
        model = super()._from_dir(path).model      # loaded, or refused in one line, as a text model's folder is
        mean = std = None
        if (path / "preprocessor_config.json").is_file():
            processor = json.loads((path / "preprocessor_config.json").read_text())
            mean, std = processor.get("image_mean"), processor.get("image_std")
        return ImageLogits(model, mean, std)

    def _images(self, batch_size, shape, module, seed):
        images = _images(batch_size, shape["input_size"], seed)
        if module.mean is not None and module.std is not None:
            images = (images - torch.tensor(module.mean).view(1, -1, 1, 1)) / torch.tensor(module.std).view(1, -1, 1, 1)
        return (images,)

    def example_inputs(self, batch_size, shape, module):
        return self._images(batch_size, shape, module, 1234)

    def calibration_inputs(self, batch_size, shape, module, n):
        return [self._images(batch_size, shape, module, 99 + i) for i in range(n)]

    def memory_estimate(self, batch_size, shape):
        return ModelSpec.memory_estimate(self, batch_size, shape)
