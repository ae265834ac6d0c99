"""llama.cpp (llama-cpp-python, CPU): its own generation loop over a GGUF file written from the weights the harness
built (backends/gguf.py), memory-mapped, with `n_threads` and `n_threads_batch` set to the run's threads.

Q8_0, Q4_0 and F16 weights load with ggml's extra buffer types (AMX, repacked weights) unless a probe found
they crash on this CPU (backends/llama_cpp_probe.py); a tensor type that crashes without them as well is refused."""

import os
import time

from ..core.errors import UnsupportedError
from .base import Prepared
from .gguf import TENSOR_TYPES, gguf_file
from .llama_cpp_probe import decision, load
from .llm_engines import Engine, EngineBackend, llama_only, one_sequence

# What llama.cpp computes with each GGUF tensor type: ggml quantizes the activations to 8-bit blocks for its
# Q8_0 and Q4_0 dot products; F32 and BF16 multiply in their own type (BF16 with fp32 accumulation).
MODES = {"F32": "native", "BF16": "bf16", "F16": "fp16", "Q8_0": "w8a8-b32", "Q4_0": "w4a8-b32"}
KV_CACHE_TYPE = "f16"      # llama.cpp's default for keys and values


class LlamaCppBackend(EngineBackend):
    name = "llama_cpp"
    description = "llama.cpp through llama-cpp-python: GGUF weights (F32/BF16/F16, Q8_0 int8, Q4_0 int4)"

    package, engine, precisions = "llama_cpp", "llama.cpp", tuple(TENSOR_TYPES)
    install = ("it builds from source with CMake and a C++ compiler: pip install llama-cpp-python "
               "(setup.sh does)")
    precisions_why = "GGUF has a tensor type for fp32, bf16, fp16, int8 (Q8_0) and int4 (Q4_0)"

    def prepare(self, model, example_inputs, precision, threads, ctx):
        llama_only(model)
        one_sequence(example_inputs, self.name)
        self.refuse_precision(precision)
        # before anything loads here: a crash in llama.cpp's kernels would end this process
        decided = decision(TENSOR_TYPES[precision])
        if decided.unsupported:
            raise UnsupportedError(decided.reason)
        path, info = gguf_file(model, precision, ctx.model_name, ctx.weights_id)
        seq_len, new_tokens = example_inputs[-1].shape[1], ctx.shape["new_tokens"]
        n_batch = max(seq_len, 8)           # the whole prompt in one batch
        start = time.perf_counter()
        try:
            llm = load(path, decided.extra_buffer_types, n_ctx=seq_len + new_tokens, n_batch=n_batch,
                       n_ubatch=n_batch, n_threads=threads, n_threads_batch=threads, use_mmap=True,
                       logits_all=False, flash_attn=False, verbose=False)
        except ValueError as exc:            # llama-cpp-python's "Failed to load model from file"
            raise UnsupportedError(f"llama.cpp could not load the GGUF file: {exc}") from None
        info.update(load_s=round(time.perf_counter() - start, 2), n_threads=threads, n_threads_batch=threads,
                    n_ctx=seq_len + new_tokens, n_batch=n_batch, n_ubatch=n_batch, flash_attn=False,
                    kv_cache=KV_CACHE_TYPE, mmap=True, **decided.info())
        config = model.model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv = 2 * config.num_hidden_layers * (seq_len + new_tokens) * config.num_key_value_heads * head_dim * 2
        engine = _Engine(llm, {"weight_bytes": os.path.getsize(path), "kv_cache_bytes": kv})
        return Prepared(engine, example_inputs, MODES[info["tensor_type"]], info)


class _Engine(Engine):
    def __init__(self, llm, facts):
        super().__init__(facts)
        self.llm = llm

    def generate(self, prompt, new_tokens):
        import torch

        ids = prompt[0].tolist()
        self.llm.reset()         # no KV cache kept from the last pass: generate() would reuse a matching prefix
        tokens, stamps = [], self.new_stamps()
        first = None
        for token in self.llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                       reset=True):
            stamps.append(time.perf_counter_ns())
            tokens.append(token)
            if first is None:          # the next token is evaluated only when asked for: still the prompt's
                first = self._last_logits()
            if len(tokens) == new_tokens:        # end of sequence ignored: exactly the tokens asked for
                break
        return torch.tensor([tokens]), torch.from_numpy(first).reshape(1, -1), stamps

    def _last_logits(self):
        """The last evaluated token's next-token logits (kept only for it: no `logits_all`)."""
        import llama_cpp
        import numpy as np

        pointer = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.llm.n_vocab(),)).copy()

    def teacher_forced(self, prompt, tokens, steps):
        import numpy as np
        import torch

        self.llm.reset()
        self.llm.eval(prompt[0].tolist())
        logits = [self._last_logits()]
        for i in range(steps):
            self.llm.eval([int(tokens[0, i])])
            logits.append(self._last_logits())
        return torch.from_numpy(np.stack(logits)[None]).float()
