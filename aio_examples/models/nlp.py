"""NLP models from transformers' architecture code: encoders, and a causal LM and an encoder-decoder for generation."""

import functools
import itertools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..core.errors import UsageError
from .base import ModelSpec

QUESTION = "Which settings decide how fast a model runs on a CPU?"
CONTEXT = ("How fast a neural network runs on a server processor depends on the number of threads, the batch "
           "size, the numeric precision and the software that executes the graph. Binding threads to cores and "
           "keeping memory on the local node removes noise, so measurements can be compared across machines. ")
MASK_SENTENCE = "Running inference on the processor is {mask} when threads are bound to physical cores."


def load_transformers():
    # transformers imports torchvision when it is installed; make sure that import works first.
    from ..compat.torchvision_shim import ensure_torchvision

    ensure_torchvision()
    # transformers imports torchao when installed, whose enums torch's pytree warns about on every start
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    import transformers

    return transformers


class EncoderModel(nn.Module):
    """(input_ids, attention_mask) in, a tuple of tensors out: a shape every backend can trace or export."""

    def __init__(self, model: nn.Module, tokenizer=None):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None):
        segments = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False, **segments)

    def encoded(self, enc) -> tuple:
        """A tokenizer's batch as inputs: with the segment ids of a text pair when the model was trained with
        them (BERT marks the second text as type 1: a fine-tuned QA head reads it)."""
        uses_segments = getattr(self.model.config, "type_vocab_size", 1) > 1 and "token_type_ids" in enc
        return (enc["input_ids"], enc["attention_mask"]) + ((enc["token_type_ids"],) if uses_segments else ())


@dataclass(frozen=True)
class Encoder(ModelSpec):
    """A transformers encoder with a task head, built from its default (base-size) config."""

    config_class: str = ""
    model_class: str = ""
    auto_class: str = ""
    config_kwargs: tuple = ()

    def _config(self):
        kwargs = {**dict(self.config_kwargs), **dict(self.config_overrides)}
        # A vocabulary made smaller by an override leaves the entry's special token ids outside it (Llama's
        # 128000): they go, unless the override set them too.
        for key in ("bos_token_id", "eos_token_id"):
            if key not in dict(self.config_overrides) and (kwargs.get(key) or -1) >= kwargs.get("vocab_size", 1 << 62):
                kwargs[key] = None
        return getattr(load_transformers(), self.config_class)(**kwargs)

    def weight_bytes(self):
        """Counted on the meta device: nothing is allocated."""
        with torch.device("meta"):
            model = getattr(load_transformers(), self.model_class)(self._config())
        return sum(p.numel() for p in model.parameters()) * 4

    @property
    def config_name(self):
        return self.config_class

    def config_dict(self):
        return self._config().to_dict()

    def smoke_shape(self):
        return {"seq_len": 32}

    def check_shape(self, shape):
        limit = self._config().max_position_embeddings - (2 if self.config_class == "RobertaConfig" else 0)
        if shape["seq_len"] > limit:
            raise UsageError(f"--seq-len {shape['seq_len']} is too long for {self.name}; accepted: 1..{limit}")

    def _build_module(self, shape):
        return EncoderModel(getattr(load_transformers(), self.model_class)(self._config()))

    def _from_dir(self, path: Path):
        tf = load_transformers()
        if not (path / "config.json").is_file():
            raise UsageError(f"--model-dir {str(path)!r} has no config.json; accepted: a local Hugging Face model folder")
        try:
            model = getattr(tf, self.auto_class).from_pretrained(path)
            tokenizer = None
            if any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")):
                tokenizer = tf.AutoTokenizer.from_pretrained(path)
        except Exception as exc:  # noqa: BLE001  (transformers raises OSError, ValueError, safetensors' own...)
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"--model-dir {str(path)!r} cannot be loaded as a {self.model_class} folder ({first}); "
                             "accepted: a local Hugging Face model folder (config.json, weights, tokenizer)") from None
        return EncoderModel(model, tokenizer)

    def _text(self, tokenizer) -> dict:
        if self.task == "question-answering":
            return {"text": QUESTION, "text_pair": CONTEXT * 8, "truncation": "only_second"}
        if self.task == "fill-mask":
            return {"text": MASK_SENTENCE.format(mask=tokenizer.mask_token), "truncation": True}
        return {"text": CONTEXT * 8, "truncation": True}

    def example_inputs(self, batch_size, shape, module):
        seq_len = shape["seq_len"]
        tokenizer = getattr(module, "tokenizer", None)
        if tokenizer is not None:
            enc = tokenizer(**self._text(tokenizer), padding="max_length", max_length=seq_len, return_tensors="pt")
            return enc["input_ids"].repeat(batch_size, 1), enc["attention_mask"].repeat(batch_size, 1)
        return self._random_ids(batch_size, seq_len, module, 1234)

    @staticmethod
    def _random_ids(batch_size, seq_len, module, seed):
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(5, module.model.config.vocab_size, (batch_size, seq_len), generator=gen)
        return ids, torch.ones_like(ids)

    def calibration_inputs(self, batch_size, shape, module, n):
        if getattr(module, "tokenizer", None) is not None:
            return super().calibration_inputs(batch_size, shape, module, n)
        return [self._random_ids(batch_size, shape["seq_len"], module, 99 + i) for i in range(n)]


class CausalLMStep(nn.Module):
    """One decoding step over a static KV cache: what a backend prepares for generation.

    A static cache keeps every step's shapes fixed (prompt length for prefill, 1 after), so a
    compiler builds two graphs once instead of one per sequence length.
    """

    def __init__(self, model: nn.Module, tokenizer=None):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer

    def new_cache(self, max_len: int):
        return load_transformers().StaticCache(config=self.model.config, max_cache_len=max_len)

    def forward(self, input_ids: torch.Tensor, past_key_values=None, cache_position=None):
        out = self.model(input_ids=input_ids, past_key_values=past_key_values, cache_position=cache_position,
                         use_cache=True)
        return out.logits[:, -1]


def graphs_compiled() -> int:
    """Graphs torch.compile has compiled in this process so far (dynamo's own counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def tensor_bytes(module: nn.Module) -> int:
    """Bytes of weights a decoded token reads, as stored: each shared tensor once, the packed inner tensors of
    quantized tensor subclasses (torchao's int8/int4 weights) rather than the dtype they present, and an
    embedding table only where an output layer shares it (otherwise a token reads one row of it: after
    weight-only quantization unties Llama's, its bf16 table is half of a small model's bytes, none of it read)."""
    def nbytes(t):
        if hasattr(t, "__tensor_flatten__"):
            names, _ = t.__tensor_flatten__()
            return sum(nbytes(getattr(t, n)) for n in names)
        return t.numel() * t.element_size()

    read_rows_only = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    read_rows_only -= {id(m.weight) for m in module.modules() if isinstance(m, nn.Linear)}
    seen, total = set(read_rows_only), 0
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += nbytes(t)
    return total


class GreedyGeneration:
    """One pass = the prompt's prefill, then greedy decoding of exactly `new_tokens` tokens (end of sequence
    ignored). Stamps the first token (TTFT) and every later one (inter-token latencies) from inside the loop,
    and counts graphs compiled during the pass; `facts` holds the KV-cache and weight bytes and the prompt's
    length.

    The step is called `step(*context, tokens, cache, positions)`. `context` holds the inputs only the prefill
    takes, before the prompt (an encoder-decoder's: Whisper's log-mel features, whose encoder then runs inside
    the prefill and so inside TTFT); decode steps get None in their place. A causal LM has none. `choose(logits,
    generated)` picks each row's next token from a step's logits after `generated` tokens (by default the
    highest logit; scoring Whisper, the choice of its `generate`: WhisperStep.next_token).
    """

    def __init__(self, step, prompt: torch.Tensor, new_tokens: int, weight_bytes: int | None = None,
                 context: tuple = (), choose=None):
        self.step, self.prompt, self.new_tokens = step, prompt, new_tokens
        self.choose = choose or (lambda logits, generated: logits.argmax(-1))
        self.context, self._no_context = tuple(context), (None,) * len(context)
        self.prompt_positions = torch.arange(prompt.shape[1])
        self.pass_metrics: dict = {}
        self.facts: dict = {"weight_bytes": weight_bytes} if weight_bytes else {}
        self.facts["prompt_tokens"] = prompt.shape[1]
        if self.context and not torch.is_floating_point(self.context[0]):   # a text encoder's source token ids
            self.facts["source_tokens"] = self.context[0].shape[1]         # (BART's article): encoded in TTFT
        self.on_first_token = None     # called as the first token is out (serving: LoadGen's FirstTokenComplete)

    def _prefill(self, cache):
        # A step may run its prefill its own way (backends/generation.py: eager beside a compiled decode step)
        return getattr(self.step, "prefill", self.step)(*self.context, self.prompt, cache, self.prompt_positions)

    def _decode(self, tokens, cache, position: int):
        return self.step(*self._no_context, tokens, cache, torch.tensor([position]))

    def __call__(self):
        compiled = graphs_compiled()
        start = time.perf_counter_ns()
        prompt_len = self.prompt.shape[1]
        cache = self.step.new_cache(prompt_len + self.new_tokens)
        first_logits = self._prefill(cache)
        tokens = [self.choose(first_logits, 0)]
        stamps = [time.perf_counter_ns()]
        if self.on_first_token is not None:
            self.on_first_token()
        for i in range(self.new_tokens - 1):
            tokens.append(self.choose(self._decode(tokens[-1][:, None], cache, prompt_len + i), i + 1))
            stamps.append(time.perf_counter_ns())
        self.pass_metrics = {"ttft": stamps[0] - start, "itl": [b - a for a, b in itertools.pairwise(stamps)],
                             "compiles": graphs_compiled() - compiled}
        if "kv_cache_bytes" not in self.facts:
            self.facts["kv_cache_bytes"] = _cache_bytes(cache)
        # The tokens, and the prompt's next-token logits for numeric output checks.
        return torch.stack(tokens, 1), first_logits

    def teacher_forced(self, tokens: torch.Tensor, steps: int) -> torch.Tensor:
        """Next-token logits of the prefill and of `steps` decode steps fed `tokens` (another run's greedy
        tokens) instead of this one's: logits comparable step by step even where greedy choices part (random
        weights give near-flat logits, so the first tie broken differently would change every later step)."""
        prompt_len = self.prompt.shape[1]
        cache = self.step.new_cache(prompt_len + self.new_tokens)
        logits = [self._prefill(cache)]
        for i in range(steps):
            # in the strides a decode step gets (a column of `tokens` has others): a compiled step would recompile
            column = tokens[:, i:i + 1].clone(memory_format=torch.contiguous_format)
            logits.append(self._decode(column, cache, prompt_len + i))
        return torch.stack([x.float() for x in logits], 1)


class EngineGeneration:
    """One pass through an LLM engine with its own generation loop (backends/llm_engines.py): the prompt's token
    ids in, exactly `new_tokens` greedy tokens out, each stamped by the engine's own per-token callback;
    the same `pass_metrics` and `facts` as GreedyGeneration, and nothing compiled while measured."""

    def __init__(self, engine, prompt: torch.Tensor, new_tokens: int):
        self.engine, self.prompt, self.new_tokens = engine, prompt, new_tokens
        self.on_first_token = None     # handed to the engine for each pass (serving)
        self.pass_metrics: dict = {}
        self.facts: dict = {**engine.facts, "prompt_tokens": prompt.shape[1]}

    def __call__(self):
        start = time.perf_counter_ns()
        self.engine.on_first_token = self.on_first_token
        tokens, first_logits, stamps = self.engine.generate(self.prompt, self.new_tokens)
        if len(stamps) != self.new_tokens:
            raise RuntimeError(f"the engine generated {len(stamps)} tokens, not the {self.new_tokens} asked for")
        self.pass_metrics = {"ttft": stamps[0] - start, "itl": [b - a for a, b in itertools.pairwise(stamps)],
                             "compiles": 0}
        return tokens, first_logits

    def teacher_forced(self, tokens: torch.Tensor, steps: int):
        return self.engine.teacher_forced(self.prompt, tokens, steps)


def cache_layers(cache) -> list:
    """A transformers cache's layers (an encoder-decoder's: those of its self- and cross-attention caches)."""
    caches = [getattr(cache, n) for n in ("self_attention_cache", "cross_attention_cache") if hasattr(cache, n)]
    return [layer for c in caches or [cache] for layer in getattr(c, "layers", None) or []]


def _cache_bytes(cache) -> int | None:
    """Bytes of a static cache's keys and values (an encoder-decoder's: its self- and cross-attention caches)."""
    tensors = [t for layer in cache_layers(cache) for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
               if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors) or None


@dataclass(frozen=True)
class CausalLM(Encoder):
    """A causal LM benchmarked as text generation: throughput in generated tokens per second."""

    def smoke_shape(self):
        return {"seq_len": 8, "new_tokens": 4}

    def check_shape(self, shape):
        config = self._config()
        limit = getattr(config, "max_position_embeddings", None) or config.n_positions
        if shape["new_tokens"] < 1:
            raise UsageError(f"--new-tokens {shape['new_tokens']} is invalid; accepted: a whole number >= 1")
        if shape["seq_len"] + shape["new_tokens"] > limit:
            raise UsageError(f"--seq-len + --new-tokens = {shape['seq_len'] + shape['new_tokens']} is too long "
                             f"for {self.name}; accepted: at most {limit}")

    def _build_module(self, shape):
        return CausalLMStep(getattr(load_transformers(), self.model_class)(self._config()))

    def _from_dir(self, path: Path):
        enc = super()._from_dir(path)
        return CausalLMStep(enc.model, enc.tokenizer)

    def example_inputs(self, batch_size, shape, module):
        seq_len, tokenizer = shape["seq_len"], getattr(module, "tokenizer", None)
        if tokenizer is not None:
            ids = tokenizer(CONTEXT * 16, return_tensors="pt")["input_ids"][:, :seq_len]
            return (ids.repeat(batch_size, 1),)
        gen = torch.Generator().manual_seed(1234)
        return (torch.randint(0, module.model.config.vocab_size, (batch_size, seq_len), generator=gen),)

    def calibration_inputs(self, batch_size, shape, module, n):
        return [pair[:1] for pair in super().calibration_inputs(batch_size, shape, module, n)]

    def task_size(self, batch_size, shape):
        return batch_size * shape["new_tokens"]

    CHECKED_STEPS = 4       # decode steps whose logits the output check compares, beside the prefill's

    def checked_output(self, one_pass, output, reference):
        """The tokens, and the logits of the prefill and the first decode steps teacher-forced with the eager
        fp32 reference's tokens (the same inputs on both sides; a pass without the method: as it is)."""
        if not hasattr(one_pass, "teacher_forced"):
            return output
        steps = min(self.CHECKED_STEPS, one_pass.new_tokens - 1)
        with torch.no_grad():
            logits = one_pass.teacher_forced(reference[0], steps)
        return (output[0],) if logits is None else (output[0], logits)     # an engine without logits: tokens

    def make_pass(self, prepared, shape):
        """Greedy generation of the prepared step: the last input is the prompt, any before it the prefill's
        context (GreedyGeneration); or, for an LLM engine with its own loop, its generation (EngineGeneration)."""
        if hasattr(prepared.fn, "generate"):
            return EngineGeneration(prepared.fn, prepared.inputs[-1], shape["new_tokens"])
        module = getattr(prepared.fn, "_orig_mod", prepared.fn)      # under torch.compile's wrapper
        weights = tensor_bytes(self.decode_weights(module)) if isinstance(module, nn.Module) else None
        return GreedyGeneration(prepared.fn, prepared.inputs[-1], shape["new_tokens"], weights,
                                context=prepared.inputs[:-1])

    def decode_weights(self, step: nn.Module) -> nn.Module:
        """The weights every decoded token reads (for the memory-bandwidth roofline): a causal LM's are all."""
        return step

    def memory_estimate(self, batch_size, shape):
        """The built model's fp32 weights, the static KV cache and the logits."""
        config = self._config()
        seq = shape["seq_len"] + shape["new_tokens"]
        layers = getattr(config, "num_hidden_layers", None) or config.n_layer
        heads = getattr(config, "num_key_value_heads", None) or getattr(config, "n_head", 12)
        head_dim = getattr(config, "head_dim", None) or (getattr(config, "hidden_size", None) or config.n_embd) // (
            getattr(config, "num_attention_heads", None) or config.n_head)
        kv = 2 * layers * batch_size * heads * head_dim * seq * 4
        return self.weight_bytes() + kv + batch_size * seq * config.vocab_size * 4


def decoder_start(model) -> list[int]:
    """An encoder-decoder's decoder prompt: its start token, then the BOS token its generation config forces first
    where it does (BART's CNN/DailyMail summarizer: `</s><s>`), as `generate` would begin."""
    generation = getattr(model, "generation_config", None)
    start = getattr(generation, "decoder_start_token_id", None)
    forced = getattr(generation, "forced_bos_token_id", None)
    return [model.config.decoder_start_token_id if start is None else start] + ([] if forced is None else [forced])


@functools.cache
def _source_layer():
    """A static cache layer as long as the encoder's output, which it takes from its first write (the prefill's
    cross-attention): the source's length is the inputs', not the step's to know."""
    load_transformers()
    from transformers.cache_utils import StaticLayer

    class SourceLayer(StaticLayer):
        def __init__(self):
            super().__init__(max_cache_len=0)

        def lazy_initialization(self, key_states, value_states):
            self.max_cache_len = key_states.shape[-2]
            super().lazy_initialization(key_states, value_states)

    return SourceLayer


class Seq2SeqStep(nn.Module):
    """An encoder-decoder (BART, Whisper) as a generation step over a static KV cache: what a backend prepares.

    `forward(source, input_ids, past_key_values, cache_position)` returns the next-token logits. With a source (the
    prefill: an article's token ids, Whisper's log-mel features) the encoder runs and the decoder's cross-attention
    writes the keys and values of its output into the cache; without (a decode step, source None) it reads them
    back. Without a cache it is one plain encoder-decoder call over the prompt. Inputs: (source, prompt ids).
    """

    def __init__(self, model: nn.Module, tokenizer=None, prompt_ids: list[int] | None = None):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.prompt_ids = decoder_start(model) if prompt_ids is None else list(prompt_ids)

    def new_cache(self, max_len: int):
        """Static self-attention layers of `max_len` positions, and cross-attention layers of the encoder's output.
        (Not StaticCache(config): an encoder-decoder's num_hidden_layers may count the encoder's layers.)"""
        load_transformers()
        from transformers.cache_utils import Cache, EncoderDecoderCache, StaticLayer

        layers = range(self.model.config.decoder_layers)
        return EncoderDecoderCache(Cache(layers=[StaticLayer(max_cache_len=max_len) for _ in layers]),
                                   Cache(layers=[_source_layer()() for _ in layers]))

    def forward(self, source, input_ids, past_key_values=None, cache_position=None):
        decoder = self.model.get_decoder()
        # activations in a layer norm's dtype: weight-only int8/int4 make the model bf16, not its inputs
        dtype = decoder.layers[0].self_attn_layer_norm.weight.dtype
        if source is not None:
            encoded = self.model.get_encoder()(source.to(dtype) if source.is_floating_point() else source)[0]
        else:
            # A decode step: cross-attention reads the encoder's keys and values from the cache; the decoder runs
            # it only when handed an encoder output, whose values it then does not read.
            encoded = torch.zeros(input_ids.shape[0], 1, self.model.config.d_model, dtype=dtype)
        hidden = decoder(input_ids=input_ids, encoder_hidden_states=encoded, cache=past_key_values,
                         use_cache=past_key_values is not None)[0]     # positions: from what the cache holds
        logits = self.model.get_output_embeddings()(hidden[:, -1])
        bias = getattr(self.model, "final_logits_bias", None)          # BART's (zero unless trained with one)
        return logits if bias is None else logits + bias[0]


@dataclass(frozen=True)
class Seq2Seq(CausalLM):
    """An encoder-decoder benchmarked as generation (summarization): throughput in generated tokens per second.

    One pass = the source (`seq_len` token ids: the article) encoded and the decoder prompt (`decoder_start`)
    prefilled, both inside time to first token, then exactly `new_tokens` tokens decoded greedily over static
    self- and cross-attention caches (the encoder's keys and values written once, in the prefill), end of
    sequence ignored. Random weights by default; `--model-dir` loads a local folder of the model class (with its
    tokenizer, whose text then fills the article).
    """

    PROMPT_MAX = 2          # the longest decoder prompt: start token and forced BOS

    def smoke_shape(self):
        return {"seq_len": 16, "new_tokens": 4}

    def check_shape(self, shape):
        limit = self._config().max_position_embeddings
        if shape["seq_len"] > limit:
            raise UsageError(f"--seq-len {shape['seq_len']} is too long for {self.name}; accepted: 1..{limit} "
                             "(the encoder's positions)")
        if shape["new_tokens"] > limit - self.PROMPT_MAX:
            raise UsageError(f"--new-tokens {shape['new_tokens']} is invalid for {self.name}; accepted: "
                             f"1..{limit - self.PROMPT_MAX} (the decoder's {limit} positions less the prompt)")

    def _step(self, model, tokenizer=None) -> Seq2SeqStep:
        return Seq2SeqStep(model, tokenizer)

    def _build_module(self, shape):
        return self._step(getattr(load_transformers(), self.model_class)(self._config()))

    def _from_dir(self, path: Path):
        loaded = Encoder._from_dir(self, path)         # the model and its tokenizer, or one line saying why not
        return self._step(loaded.model, loaded.tokenizer)

    @staticmethod
    def prompt(module: Seq2SeqStep, batch_size: int) -> torch.Tensor:
        return torch.tensor([module.prompt_ids]).repeat(batch_size, 1)

    def example_inputs(self, batch_size, shape, module):
        """The article: the tokenizer's ids of a repeated text cut to `seq_len`, or fixed random ids outside the
        special tokens; and the decoder prompt."""
        seq_len, tokenizer = shape["seq_len"], module.tokenizer
        if tokenizer is not None:
            text = CONTEXT * (seq_len // 16 + 1)          # a repetition of CONTEXT is > 16 tokens
            ids = tokenizer(text, truncation=True, max_length=seq_len, return_tensors="pt")["input_ids"]
            source = ids.repeat(batch_size, 1)
        else:
            source = self._random_ids(batch_size, seq_len, module, 1234)[0]
        return source, self.prompt(module, batch_size)

    def calibration_inputs(self, batch_size, shape, module, n):
        return ModelSpec.calibration_inputs(self, batch_size, shape, module, n)

    def decode_weights(self, step):
        """A decoded token reads the decoder's weights and the output projection (tied to the token embeddings),
        not the encoder's."""
        return nn.ModuleList([step.model.get_decoder(), step.model.get_output_embeddings()])

    def source_positions(self, shape) -> int:
        """Positions of the encoder's output (the cross-attention cache's length)."""
        return shape["seq_len"]

    def source_bytes(self, shape) -> int:
        """Bytes of one sample's source input."""
        return shape["seq_len"] * 8

    def memory_estimate(self, batch_size, shape):
        """The built model's fp32 weights, the encoder's widest activations (the feed-forward, one layer's
        attention scores), the static self- and cross-attention caches, the source and the logits."""
        config = self._config()
        positions, width = self.source_positions(shape), config.d_model
        encoder = batch_size * (positions * (4 * width + config.encoder_ffn_dim)
                                + config.encoder_attention_heads * positions * positions) * 4
        steps = self.PROMPT_MAX + shape["new_tokens"]
        caches = 2 * config.decoder_layers * batch_size * width * (steps + positions) * 4
        return (self.weight_bytes() + encoder + caches + batch_size * self.source_bytes(shape)
                + 2 * batch_size * config.vocab_size * 4)
