"""Speech recognition: Whisper (an encoder-decoder) from transformers' architecture code, benchmarked as generation.

One pass = the encoder over 30 s of audio as log-mel features (batch, 80, 3000), the decoder prompt
`<|startoftranscript|><|en|><|transcribe|><|notimestamps|>` prefilled, then exactly `--new-tokens` tokens
decoded greedily over a static KV cache, end of text ignored (GreedyGeneration, models/nlp.py): the encoder runs
inside the prefill, so time to first token includes it. The cross-attention keys and values of the encoder's
output are computed once, in the prefill, into a static cache of their own that every decode step reads.
"""

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..core.errors import UsageError
from .base import ModelSpec
from .nlp import CausalLM, Encoder, load_transformers

PROMPT_TOKENS = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")
# Their ids in the multilingual Whisper vocabulary (openai/whisper-tiny's and -base's generation config): the
# prompt of random weights, and of a folder with neither a Whisper generation config nor a tokenizer.
PROMPT_IDS = (50258, 50259, 50359, 50363)
SAMPLING_RATE = 16000
FRAMES_PER_SECOND = 100         # WhisperFeatureExtractor's hop of 160 samples at 16 kHz


def decoder_prompt(model, tokenizer=None) -> list[int]:
    """The start-of-transcript prompt's ids: from a real Whisper folder's generation config (English-only models
    take no language or task token), else from its tokenizer, else PROMPT_IDS; random weights over a vocabulary
    too small for those (a --config-override) take its last four ids, which serve as well."""
    generation = getattr(model, "generation_config", None)
    vocab = model.config.vocab_size
    no_timestamps = getattr(generation, "no_timestamps_token_id", None)
    found = (tokenizer.convert_tokens_to_ids(list(PROMPT_TOKENS)) if tokenizer is not None else [])
    if no_timestamps is not None:
        language = (getattr(generation, "lang_to_id", None) or {}).get("<|en|>")
        task = (getattr(generation, "task_to_id", None) or {}).get("transcribe")
        multilingual = getattr(generation, "is_multilingual", False) and None not in (language, task)
        ids = [generation.decoder_start_token_id, *([language, task] if multilingual else []), no_timestamps]
    elif found and tokenizer.unk_token_id not in found:
        ids = list(found)
    elif tokenizer is None and vocab <= max(PROMPT_IDS):
        return list(range(vocab - len(PROMPT_IDS), vocab))
    else:
        ids = list(PROMPT_IDS)
    if max(ids) >= vocab:
        raise UsageError(f"Whisper's prompt {ids} does not fit the model's vocabulary of {vocab}; accepted: a "
                         "Whisper folder whose tokenizer or generation config has the start-of-transcript tokens")
    return ids


class WhisperStep(nn.Module):
    """Whisper as a generation step over a static KV cache: what a backend prepares.

    `forward(input_features, input_ids, past_key_values, cache_position)` returns the next-token logits. With
    features (the prefill) the encoder runs and the decoder's cross-attention writes the keys and values of its
    output into the cache; without (a decode step, features None) it reads them back. Without a cache it is one
    plain encoder-decoder call over the prompt. Inputs: (features, prompt ids), the prompt last.
    """

    def __init__(self, model: nn.Module, tokenizer=None, feature_extractor=None):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.feature_extractor = feature_extractor
        self.prompt_ids = decoder_prompt(model, tokenizer)

    @property
    def frames(self) -> int:
        """Log-mel frames the encoder takes (3000: 30 s), two per encoder position (its stride-2 convolution)."""
        return 2 * self.model.config.max_source_positions

    def new_cache(self, max_len: int):
        """Static self-attention layers of `max_len` positions, and cross-attention layers of the encoder's
        length. (Not StaticCache(config): WhisperConfig's num_hidden_layers counts the encoder's layers.)"""
        load_transformers()
        from transformers.cache_utils import Cache, EncoderDecoderCache, StaticLayer

        config = self.model.config
        layers = lambda length: Cache(layers=[StaticLayer(max_cache_len=length) for _ in range(config.decoder_layers)])
        return EncoderDecoderCache(layers(max_len), layers(config.max_source_positions))

    def forward(self, input_features, input_ids, past_key_values=None, cache_position=None):
        whisper = self.model.model
        if input_features is not None:
            # in the weights' dtype: weight-only int8/int4 make the model bf16, not its inputs
            features = input_features.to(whisper.encoder.conv1.weight.dtype)
            encoded = whisper.encoder(features).last_hidden_state
        else:
            # A decode step: cross-attention reads the encoder's keys and values from the cache; the decoder runs
            # it only when handed an encoder output, whose values it then does not read.
            encoded = torch.zeros(input_ids.shape[0], 1, self.model.config.d_model,
                                  dtype=whisper.decoder.layer_norm.weight.dtype)
        positions = None if cache_position is None else cache_position[None].expand(input_ids.shape[0], -1)
        hidden = whisper.decoder(input_ids=input_ids, encoder_hidden_states=encoded, cache=past_key_values,
                                 position_ids=positions, use_cache=past_key_values is not None).last_hidden_state
        return self.model.proj_out(hidden[:, -1])


@dataclass(frozen=True)
class Whisper(CausalLM):
    """Whisper benchmarked as speech-to-text generation: throughput in generated tokens per second.

    Its shape is `new_tokens` alone: the audio is always the 30 s window the encoder takes, the prompt the
    4 start-of-transcript tokens (2 for an English-only folder). Random weights by default; `--model-dir` loads a
    local Whisper folder (WhisperForConditionalGeneration, with its tokenizer and feature extractor if there).
    """

    @property
    def family(self) -> str:
        return "speech"

    def smoke_shape(self):
        return {"new_tokens": 4}

    def check_shape(self, shape):
        limit = self._config().max_target_positions - len(PROMPT_IDS)
        if not 1 <= shape["new_tokens"] <= limit:
            raise UsageError(f"--new-tokens {shape['new_tokens']} is invalid for {self.name}; accepted: 1..{limit} "
                             f"(the decoder's {limit + len(PROMPT_IDS)} positions less the prompt)")

    def _build_module(self, shape):
        return WhisperStep(getattr(load_transformers(), self.model_class)(self._config()))

    def _from_dir(self, path: Path):
        loaded = Encoder._from_dir(self, path)         # the model and its tokenizer, or one line saying why not
        extractor = None
        if (path / "preprocessor_config.json").is_file():
            try:
                extractor = load_transformers().WhisperFeatureExtractor.from_pretrained(path)
            except (OSError, ValueError, TypeError) as exc:
                raise UsageError(f"--model-dir {str(path)!r}: its preprocessor_config.json is not a Whisper feature "
                                 f"extractor's ({str(exc).splitlines()[0][:160]}); accepted: a Whisper folder") from None
        return WhisperStep(loaded.model, loaded.tokenizer, extractor)

    @staticmethod
    def prompt(module: WhisperStep, batch_size: int) -> torch.Tensor:
        return torch.tensor([module.prompt_ids]).repeat(batch_size, 1)

    def example_inputs(self, batch_size, shape, module):
        """Fixed pseudo-random features in the range of Whisper's normalised log-mel (-1.5..1.5), and the prompt."""
        gen = torch.Generator().manual_seed(1234)
        mels = module.model.config.num_mel_bins
        features = torch.rand((batch_size, mels, module.frames), generator=gen) * 2 - 1
        return features, self.prompt(module, batch_size)

    def calibration_inputs(self, batch_size, shape, module, n):
        return ModelSpec.calibration_inputs(self, batch_size, shape, module, n)

    def audio_inputs(self, module: WhisperStep, waveforms: list) -> tuple:
        """Model inputs of 16 kHz mono waveforms (float arrays): WhisperFeatureExtractor's log-mel features (the
        folder's own, else one with default settings; audio past the window is cut, shorter audio padded with
        silence), cut to the encoder's frames, and the prompt."""
        mels, frames = module.model.config.num_mel_bins, module.frames
        extractor = module.feature_extractor
        if extractor is None or extractor.feature_size != mels or extractor.nb_max_frames < frames:
            seconds = math.ceil(frames / FRAMES_PER_SECOND)
            extractor = load_transformers().WhisperFeatureExtractor(feature_size=mels, chunk_length=seconds)
        features = extractor(waveforms, sampling_rate=SAMPLING_RATE, return_tensors="pt")["input_features"]
        return features[..., :frames].float(), self.prompt(module, len(waveforms))

    def decode_weights(self, step):
        """A decoded token reads the decoder's weights and the output projection (tied to the token embeddings),
        not the encoder's."""
        return nn.ModuleList([step.model.model.decoder, step.model.proj_out])

    def memory_estimate(self, batch_size, shape):
        """The built model's fp32 weights, the encoder's widest activations (the feed-forward, one layer's
        attention scores), the static self- and cross-attention caches, the features and the logits."""
        config = self._config()
        positions, width = config.max_source_positions, config.d_model
        encoder = batch_size * (positions * (4 * width + config.encoder_ffn_dim)
                                + config.encoder_attention_heads * positions * positions) * 4
        steps = len(PROMPT_IDS) + shape["new_tokens"]
        caches = 2 * config.decoder_layers * batch_size * width * (steps + positions) * 4
        features = batch_size * config.num_mel_bins * 2 * positions * 4
        return self.weight_bytes() + encoder + caches + features + 2 * batch_size * config.vocab_size * 4
