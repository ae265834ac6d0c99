"""What the LLM engines (llama.cpp, ONNX Runtime GenAI, OpenVINO GenAI) share: they run their own generation loop
over weights written in their own format from the model the harness built, so every engine and every torch
path starts from the same weights.

An engine's `Prepared.fn` is an `Engine`: the generation scenario (models/nlp.py, EngineGeneration) calls
`generate` for one pass and times each token from the engine's own per-token callback; the output check calls
`teacher_forced` for logits comparable with eager fp32's, where the engine exposes logits.
"""

import json
from pathlib import Path

from ..core.errors import UnsupportedError
from .artifacts import artifact_dir
from .base import Backend
from .exports import cached_artifact

# The engine's own weights against the built model's fp32 ones (its format's bytes per weight, scales included)
_WEIGHT_SHARE = {"fp32": 1.0, "bf16": 0.5, "fp16": 0.5, "int8": 0.3, "int4": 0.2}


class EngineBackend(Backend):
    """A backend whose engine runs its own generation loop over weights written in its own format. Subclasses
    set `package` (the module to import), `install` (how), `engine` (its name in messages), `precisions`
    and `precisions_why` (what its format offers)."""

    package = install = engine = precisions_why = ""
    precisions: tuple = ()

    def unavailable_reason(self):
        import importlib

        try:
            importlib.import_module(self.package)
        except ImportError as exc:
            return f"{self.package} is not installed ({exc}); {self.install}"
        return None

    def unsupported_reason(self, spec, precision):
        from ..models.base import is_generator

        if not is_generator(spec.task):
            return f"{self.engine} runs text generation only"
        return self._precision_reason(precision)

    def _precision_reason(self, precision) -> str | None:
        if precision not in self.precisions:
            return f"{self.precisions_why}, not {precision} (accepted: {', '.join(self.precisions)})"
        return None

    def refuse_precision(self, precision) -> None:
        """In `prepare`: aio's strategies reach it without `unsupported_reason`."""
        reason = self._precision_reason(precision)
        if reason:
            raise UnsupportedError(reason)

    def working_copy(self, model, precision):
        return model            # only read, to write the engine's own format: no copy needed

    def memory_estimate(self, weight_bytes, precision, generator):
        return weight_bytes * _WEIGHT_SHARE.get(precision, 1.0) * self.copies_held


class Engine:
    """One loaded engine model. `facts` are recorded with the generation metrics (`weight_bytes`: what a decode
    step reads, for the roofline; `kv_cache_bytes` where known)."""

    def __init__(self, facts: dict):
        self.facts = facts
        self.on_first_token = None        # called as the first token is out (serving: LoadGen's FirstTokenComplete)

    def new_stamps(self) -> list:
        """The list `generate` stamps each token into: the first stamp also calls `on_first_token`."""
        return _Stamps(self.on_first_token)

    def generate(self, prompt, new_tokens: int):
        """Greedy generation of exactly `new_tokens` after `prompt` (a (1, n) tensor of token ids), end of
        sequence ignored, nothing reused from an earlier call. Returns (tokens (1, new_tokens) int64 tensor,
        the prompt's next-token logits (1, vocab) or None, one perf_counter_ns stamp per token)."""
        raise NotImplementedError

    def teacher_forced(self, prompt, tokens, steps: int):
        """Logits (1, steps + 1, vocab) of the prefill and of `steps` decode steps fed `tokens`; None when the
        engine exposes no logits (then tokens alone are compared)."""


class _Stamps(list):
    def __init__(self, on_first):
        super().__init__()
        self.on_first = on_first

    def append(self, stamp) -> None:
        super().append(stamp)
        if len(self) == 1 and self.on_first is not None:
            self.on_first()


def llama_only(step) -> None:
    """The engines here take Llama-architecture causal LMs (Llama 3.2 1B, TinyLlama, Llama 3 8B...)."""
    model_type = getattr(getattr(getattr(step, "model", None), "config", None), "model_type", None)
    if not hasattr(step, "new_cache") or model_type != "llama":
        raise UnsupportedError(f"the LLM engines run Llama-architecture causal LMs, not {model_type or type(step).__name__}")


def one_sequence(example_inputs, engine: str) -> None:
    prompt = example_inputs[-1]
    if prompt.shape[0] != 1:
        raise UnsupportedError(f"{engine} runs one sequence per pass here (batch 1), not a batch of {prompt.shape[0]}")


def hf_folder(step, model_name: str, weights_id: str) -> Path:
    """The step's causal LM saved as a Hugging Face folder (config, safetensors, tokenizer), once per weights:
    what ONNX Runtime GenAI's model builder reads. A model without a tokenizer (random weights) gets a
    stand-in word-level one of its vocabulary size: token ids are fed to the engines directly. Special token
    ids a shrunk vocabulary lost are set to its last ids, which builders require."""
    folder = artifact_dir("hf-folder", model_name, weights=weights_id, source=str(next(step.parameters()).dtype))

    def make(scratch):
        model, tokenizer = step.model, getattr(step, "tokenizer", None)
        vocab = model.config.vocab_size
        model.save_pretrained(scratch)
        saved = json.loads((scratch / "config.json").read_text())
        saved["bos_token_id"], saved["eos_token_id"] = special_ids(model.config)
        (scratch / "config.json").write_text(json.dumps(saved, indent=1))
        if tokenizer is not None:
            tokenizer.save_pretrained(scratch)
        else:
            _stand_in_tokenizer(vocab, saved["bos_token_id"], saved["eos_token_id"]).save_pretrained(scratch)
        return {}

    cached_artifact(folder, "config.json", make)
    return folder


def special_ids(config) -> tuple[int, int]:
    """(bos, eos) inside the vocabulary: a shrunk vocabulary (a small test model of a large one) loses the
    model's own, and builders and tokenizers need both, so its last two ids stand in."""
    vocab = config.vocab_size
    ids = []
    for key, fallback in (("bos_token_id", vocab - 2), ("eos_token_id", vocab - 1)):
        value = getattr(config, key, None)
        if isinstance(value, list):          # Llama 3.1+: several end-of-sequence ids; the first is the main one
            value = value[0] if value else None
        ids.append(value if isinstance(value, int) and 0 <= value < vocab else fallback)
    return ids[0], ids[1]


def _stand_in_tokenizer(vocab: int, bos: int, eos: int):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from ..models.nlp import load_transformers

    words = {f"<t{i}>": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="<t0>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return load_transformers().PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<t0>",
                                                       bos_token=f"<t{bos}>", eos_token=f"<t{eos}>")
