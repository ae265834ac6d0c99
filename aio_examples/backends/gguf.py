"""A Llama-architecture generation step written as one GGUF file (the `gguf` package): the weights llama.cpp and
OpenVINO GenAI load, made once per weights, precision and library version and cached like the ONNX exports.

The precisions map to GGUF's own tensor types, which are what the engines then run (recorded as such):
fp32 F32, bf16 BF16, fp16 F16, int8 Q8_0 and int4 Q4_0 (blocks of 32 weights with one fp16 scale each, unlike
torchao's int4 in groups of 128). Norm weights stay F32, as llama.cpp's own converter leaves them.
"""

import json
import math
import time
from pathlib import Path

from ..core.errors import UnsupportedError
from .artifacts import artifact_dir
from .exports import cached_artifact
from .llm_engines import special_ids

MODEL_FILE = "model.gguf"
WRITER = 2           # this module's own revision: raised when what it writes changes, so old files are remade
TENSOR_TYPES = {"fp32": "F32", "bf16": "BF16", "fp16": "F16", "int8": "Q8_0", "int4": "Q4_0"}
FORMATS = {"F32": "fp32 weights", "BF16": "bf16 weights", "F16": "fp16 weights",
           "Q8_0": "int8 weights, blocks of 32 with one fp16 scale", "Q4_0": "int4 weights, blocks of 32 with one fp16 scale"}
# HF Llama parameter names -> GGUF's (per block: the part after `model.layers.N.`)
_BLOCK = {"input_layernorm.weight": "attn_norm", "self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight": "attn_k",
          "self_attn.v_proj.weight": "attn_v", "self_attn.o_proj.weight": "attn_output",
          "post_attention_layernorm.weight": "ffn_norm", "mlp.gate_proj.weight": "ffn_gate",
          "mlp.up_proj.weight": "ffn_up", "mlp.down_proj.weight": "ffn_down"}
_TOP = {"model.embed_tokens.weight": "token_embd", "model.norm.weight": "output_norm", "lm_head.weight": "output"}


def versions() -> dict:
    from importlib.metadata import version

    import gguf

    return {"gguf": version("gguf"), "format": gguf.GGUF_VERSION, "writer": WRITER}


def gguf_file(step, precision: str, model_name: str, weights_id: str, kind: str | None = None) -> tuple[Path, dict]:
    """The GGUF file of a generation step's causal LM at `precision`, written on first use. Returns the path and
    what it holds (tensor type, its format, the tokenizer kind, conversion seconds or `cached`).

    `kind` overrides the tensor type for an engine that cannot read the precision's own: bf16 as F16 holds
    the bf16-rounded weights, exactly wherever they lie in F16's range (the share that does not is recorded)."""
    model = step.model
    config = model.config
    if getattr(config, "model_type", None) != "llama":
        raise UnsupportedError(f"only Llama-architecture models are written as GGUF here, not {config.model_type!r}")
    if precision not in TENSOR_TYPES:
        raise UnsupportedError(f"GGUF has no tensor type for {precision}; accepted: {', '.join(TENSOR_TYPES)}")
    kind = kind or TENSOR_TYPES[precision]
    rounded = precision == "bf16" and kind != "BF16"
    # The weights' digest is the built model's, and aio's engine strategies convert its bf16 working copy:
    # the source dtype is part of the key, except for BF16, which both sources give bit for bit (one file,
    # its pages shared when two configurations map it)
    source = None if kind == "BF16" else str(next(model.parameters()).dtype)
    folder = artifact_dir("gguf", model_name, weights=weights_id, source=source, tensor_type=kind,
                          rounded_to="bf16" if rounded else None, versions=versions())

    def make(scratch):
        start = time.perf_counter()
        info = _write(scratch / MODEL_FILE, model, getattr(step, "tokenizer", None), kind, rounded)
        return {**info, "tensor_type": kind, "format": FORMATS[kind] + (", bf16-rounded" if rounded else ""),
                "file": str(folder / MODEL_FILE),
                "convert_s": round(time.perf_counter() - start, 2)}

    info, cached = cached_artifact(folder, MODEL_FILE, make)
    return folder / MODEL_FILE, {**info, **({"cached": True} if cached else {})}


def _write(path: Path, model, tokenizer, kind: str, rounded: bool = False) -> dict:
    import gguf
    import numpy as np
    import torch

    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("aio-examples export")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(getattr(config, "rope_theta", None) or _rope(config).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(getattr(gguf.LlamaFileType, {"F32": "ALL_F32"}.get(kind, f"MOSTLY_{kind}")))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokenizer_kind = _add_tokenizer(writer, tokenizer, config)

    state = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)         # llama.cpp reads a missing output as the tied embeddings
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    inexact = total = 0
    for name, tensor in state.items():
        out = _gguf_name(name)
        if out is None:
            continue
        tensor = tensor.detach()
        if rounded:
            tensor = tensor.to(torch.bfloat16)
            if tensor.dim() > 1 and kind == "F16":
                inexact += int((tensor.to(torch.float16).to(torch.bfloat16) != tensor).sum())
                total += tensor.numel()
        data = tensor.float().numpy()
        if out.endswith("attn_q"):
            data = _interleave_rope(data, heads)
        elif out.endswith("attn_k"):
            data = _interleave_rope(data, kv_heads)
        if data.ndim == 1:
            writer.add_tensor(out + ".weight", data.astype(np.float32))
            continue
        if kind in ("F32", "F16"):
            writer.add_tensor(out + ".weight", data.astype(np.float32 if kind == "F32" else np.float16))
        else:
            packed = gguf.quants.quantize(data, qtype)
            writer.add_tensor(out + ".weight", packed, raw_shape=packed.shape, raw_dtype=qtype)
    factors = _llama3_rope_factors(config, head_dim)
    if factors is not None:
        writer.add_tensor("rope_freqs.weight", factors)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    info = {"tokenizer": tokenizer_kind}
    if total:
        info["f16_inexact_share"] = inexact / total      # bf16 weights outside F16's range or precision
    return info


def _gguf_name(name: str) -> str | None:
    if name in _TOP:
        return _TOP[name]
    parts = name.split(".", 3)             # model, layers, N, rest
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _BLOCK:
        return f"blk.{parts[2]}.{_BLOCK[parts[3]]}"
    return None


def _interleave_rope(w, n_head: int):
    """transformers rotates the two halves of each head; GGUF's llama rotates adjacent pairs: the q and k rows
    are reordered to match (llama.cpp's converter does the same)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope(config) -> dict:
    return dict(getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {})


def _llama3_rope_factors(config, head_dim: int):
    """Llama 3's frequency-dependent RoPE scaling as per-frequency divisors (GGUF's `rope_freqs`)."""
    import numpy as np

    rope = _rope(config)
    if rope.get("rope_type") != "llama3":
        return None
    base = float(getattr(config, "rope_theta", None) or rope.get("rope_theta"))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _add_tokenizer(writer, tokenizer, config) -> str:
    """A byte-level BPE vocabulary (the kind both engines read from GGUF): the model folder's own when it has
    one, else a stand-in of the model's vocabulary size. Token ids are what the engines are fed, so the
    stand-in only has to load; its 256 byte tokens make every id printable."""
    special = set(special_ids(config))
    if tokenizer is not None and getattr(tokenizer, "is_fast", False):
        model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
        if model.get("type") == "BPE":
            vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
            tokens = [t for t, _ in vocab]
            added = {i: str(token) for i, token in tokenizer.added_tokens_decoder.items()}
            tokens += [added.get(i, f"<unused{i}>") for i in range(len(tokens), config.vocab_size)]
            merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
            _tokens(writer, config, tokens[:config.vocab_size], merges, special | set(added))
            return "the model folder's byte-level BPE"
    alphabet = _byte_alphabet()
    tokens = alphabet + [f"<t{i}>" for i in range(len(alphabet), config.vocab_size)]
    _tokens(writer, config, tokens[:config.vocab_size], [f"{alphabet[60]} {alphabet[116]}"], special)   # "< t"
    return "a stand-in byte-level BPE vocabulary (token ids are fed directly)"


def _tokens(writer, config, tokens, merges, control) -> None:
    import gguf

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if i in control else gguf.TokenType.NORMAL
                            for i in range(len(tokens))])
    writer.add_token_merges(merges)
    bos, eos = special_ids(config)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(False)          # the prompt's token ids are given as they are


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values (byte-level BPE), as transformers maps them."""
    from ..models.nlp import load_transformers

    load_transformers()             # transformers importable on this torch (models/nlp.py)
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    mapping = bytes_to_unicode()
    return [mapping[b] for b in range(256)]
