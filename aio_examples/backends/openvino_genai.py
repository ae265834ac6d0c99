"""OpenVINO GenAI: its `LLMPipeline` (continuous-batching scheduler with paged attention, the CPU default) over
the GGUF file the harness writes (backends/gguf.py), which OpenVINO GenAI's own GGUF reader turns into an
OpenVINO model: the same weights llama.cpp runs.

The inference precision and the KV-cache precision are pinned (on CPUs with bf16 OpenVINO would otherwise
pick bf16 and a u8 KV cache by itself) and read back from the compiled model's properties, which OpenVINO
GenAI prints when `OPENVINO_LOG_LEVEL` asks for it: the pipeline exposes no compiled model.
"""

import contextlib
import os
import re
import sys
import tempfile
import time

from ..core.errors import UnsupportedError
from .base import Prepared
from .gguf import gguf_file
from .llm_engines import Engine, EngineBackend, llama_only, one_sequence

# precision -> (GGUF tensor type written, inference precision, KV-cache precision). Its GGUF reader takes
# F16, Q8_0 and Q4_0 weights, not F32 or BF16: bf16 is written as F16 holding the bf16-rounded weights and
# computed in bf16. int8/int4 compute in bf16 like the torch paths' activations (f32 on a CPU without bf16),
# with OpenVINO's own dynamic int8 quantization of the activations where it applies (read back).
PRECISIONS = {"bf16": ("F16", "bf16", "bf16"), "fp16": ("F16", "f16", "f16"),
              "int8": ("Q8_0", "bf16", "bf16"), "int4": ("Q4_0", "bf16", "bf16")}
_NEEDS = {"bf16": "BF16", "f16": "FP16"}            # OPTIMIZATION_CAPABILITIES a compute type needs natively
_WEIGHTS = {"F16": "f16", "Q8_0": "w8", "Q4_0": "w4"}
READ_BACK = ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "KEY_CACHE_PRECISION", "VALUE_CACHE_PRECISION",
             "INFERENCE_NUM_THREADS", "NUM_STREAMS", "DYNAMIC_QUANTIZATION_GROUP_SIZE", "ENABLE_CPU_PINNING",
             "PERFORMANCE_HINT")


class OpenVINOGenAIBackend(EngineBackend):
    name = "openvino_genai"
    description = "OpenVINO GenAI LLMPipeline over the GGUF file (F16 for bf16/fp16, Q8_0 int8, Q4_0 int4)"

    package, engine, precisions = "openvino_genai", "OpenVINO GenAI", tuple(PRECISIONS)
    install = "pip install openvino-genai"
    precisions_why = "its GGUF reader takes F16, Q8_0 and Q4_0 weights (bf16, fp16, int8, int4)"
    copies_held = 2.0        # the model its reader builds in memory, and the compiled one's repacked weights

    def _precision_reason(self, precision):
        reason = super()._precision_reason(precision)
        if reason or precision not in PRECISIONS:
            return reason
        import openvino as ov

        compute = _pins(precision)[1]              # int8/int4 compute in f32 where bf16 is not native
        capabilities = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        if compute in _NEEDS and _NEEDS[compute] not in capabilities:
            return (f"{precision} needs native {_NEEDS[compute]} support, which this CPU lacks "
                    f"(OpenVINO OPTIMIZATION_CAPABILITIES: {', '.join(capabilities)})")
        return None

    def prepare(self, model, example_inputs, precision, threads, ctx):
        import openvino_genai as og

        llama_only(model)
        one_sequence(example_inputs, self.name)
        self.refuse_precision(precision)
        config = model.model.config
        heads = config.num_attention_heads
        if (getattr(config, "head_dim", None) or config.hidden_size // heads) * heads != config.hidden_size:
            raise UnsupportedError("OpenVINO GenAI's GGUF reader takes head size = hidden size / heads, not "
                                   f"head_dim {config.head_dim} with hidden size {config.hidden_size} and {heads} heads")
        kind, compute, kv = _pins(precision)
        path, info = gguf_file(model, precision, ctx.model_name, ctx.weights_id, kind=kind)
        seq_len = example_inputs[-1].shape[1]
        scheduler = og.SchedulerConfig()
        scheduler.enable_prefix_caching = False      # its default reuses a repeated prompt's KV cache
        # the whole prompt in one prefill step, as the other engines run it (its default splits at 256)
        scheduler.max_num_batched_tokens = max(seq_len, scheduler.max_num_batched_tokens)
        properties = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": compute,
                      "KV_CACHE_PRECISION": kv, "PERFORMANCE_HINT": "LATENCY"}
        start = time.perf_counter()
        try:
            with _printed() as printed:
                pipe = og.LLMPipeline(str(path), "CPU", scheduler_config=scheduler, **properties)
        except RuntimeError as exc:
            raise UnsupportedError(f"OpenVINO GenAI could not load the GGUF file: {_first_line(exc)}") from None
        info["load_s"] = round(time.perf_counter() - start, 2)
        read = _read_back(printed.text)
        asked = {"INFERENCE_PRECISION_HINT": compute, "KV_CACHE_PRECISION": kv, "INFERENCE_NUM_THREADS": str(threads)}
        for key, value in asked.items():
            if key in read and read[key] != value:
                raise UnsupportedError(f"{precision} asked OpenVINO GenAI for {key}={value} but it runs {read[key]}")
        info.update(openvino_genai=og.__version__.split("-")[0], attention="paged (continuous batching)",
                    prefix_caching=False, max_num_batched_tokens=scheduler.max_num_batched_tokens,
                    properties_asked=properties,
                    read_back=read or "not printed by this OpenVINO GenAI version: the values asked are recorded")
        if kind != "F16":
            group = read.get("DYNAMIC_QUANTIZATION_GROUP_SIZE")
            info["activations"] = (f"int8, quantized at run time in groups of {group} (DYNAMIC_QUANTIZATION_GROUP_SIZE) "
                                   f"where OpenVINO's kernels take it, else {compute}"
                                   if group not in (None, "0") else compute)
        if _llama3_scaled(config):
            info["rope_scaling"] = "not applied: OpenVINO GenAI's GGUF reader ignores rope_freqs (Llama 3 RoPE scaling)"
        mode = _mode(kind, read.get("INFERENCE_PRECISION_HINT", compute), read.get("DYNAMIC_QUANTIZATION_GROUP_SIZE"))
        engine = _Engine(og, pipe, {"weight_bytes": os.path.getsize(path)})
        return Prepared(engine, example_inputs, mode, info)


def _pins(precision: str) -> tuple[str, str, str]:
    import openvino as ov

    kind, compute, kv = PRECISIONS[precision]
    if precision in ("int8", "int4") and "BF16" not in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        compute = kv = "f32"
    return kind, compute, kv


def _mode(kind: str, compute: str, dq_group) -> str:
    """bf16 or f16 where the weights are 16-bit; else w8/w4 in blocks of 32 with the activations OpenVINO
    runs: int8 where its dynamic quantization is on (a group size > 0), else the compute type."""
    if kind == "F16":
        return compute
    activations = "a8" if dq_group not in (None, "0") else {"f32": "a32"}.get(compute, "a16")
    return f"{_WEIGHTS[kind]}{activations}-b32"


def _llama3_scaled(config) -> bool:
    scaling = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    return isinstance(scaling, dict) and scaling.get("rope_type") == "llama3"


def _first_line(exc) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip() and "Exception from" not in line]
    return (lines or [str(exc)])[0][:300]


class _Printed:
    text = ""


@contextlib.contextmanager
def _printed():
    """Native stdout captured (OpenVINO GenAI prints compiled-model properties with std::cout) while
    `OPENVINO_LOG_LEVEL` asks it to print them."""
    import ctypes

    out = _Printed()
    sys.stdout.flush()
    saved_fd, saved_level = os.dup(1), os.environ.get("OPENVINO_LOG_LEVEL")
    os.environ["OPENVINO_LOG_LEVEL"] = "3"
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield out
        finally:
            ctypes.CDLL(None).fflush(None)
            os.dup2(saved_fd, 1)
            os.close(saved_fd)
            if saved_level is None:
                os.environ.pop("OPENVINO_LOG_LEVEL", None)
            else:
                os.environ["OPENVINO_LOG_LEVEL"] = saved_level
            sink.seek(0)
            out.text = sink.read().decode(errors="replace")


def _read_back(text: str) -> dict:
    """The properties of the LLM's compiled model from OpenVINO GenAI's print-out (its tokenizer models come
    first, each under its own `Model:` title)."""
    sections = re.split(r"^Model: ", text, flags=re.MULTILINE)
    llm = next((s for s in sections[1:] if s.startswith("LLM")), None)
    if llm is None:
        return {}
    found = dict(re.findall(r"^\s+([A-Z_]+): (.*)$", llm, flags=re.MULTILINE))
    return {key: found[key].strip() for key in READ_BACK if key in found}


class _Engine(Engine):
    def __init__(self, og, pipe, facts):
        super().__init__(facts)
        self.og, self.pipe = og, pipe
        self.config = og.GenerationConfig()
        self.config.ignore_eos = True          # exactly the tokens asked for; greedy by default

    def generate(self, prompt, new_tokens):
        import numpy as np
        import openvino as ov
        import torch

        ids = prompt.numpy().astype(np.int64)
        self.config.max_new_tokens = new_tokens
        streamer = _Stamps(self.og, self.new_stamps())
        self.pipe.generate(self.og.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), self.config,
                           streamer)
        # no logits from the pipeline: the output check compares tokens
        return torch.tensor([streamer.tokens]), None, streamer.stamps

    def teacher_forced(self, prompt, tokens, steps):
        return None


def _Stamps(og, stamps: list):
    """A streamer stamping each token into `stamps` as the pipeline hands it over (one call per decode step)."""

    class Stamps(og.StreamerBase):
        def __init__(self):
            super().__init__()
            self.tokens, self.stamps = [], stamps

        def write(self, token):
            now = time.perf_counter_ns()
            for t in token if isinstance(token, list) else [token]:
                self.tokens.append(int(t))
                self.stamps.append(now)
            return og.StreamingStatus.RUNNING

        def end(self):
            pass

    return Stamps()
