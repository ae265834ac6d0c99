"""Speech recognition: Whisper (an encoder-decoder) from transformers' architecture code, benchmarked as generation.

One pass = the encoder over 30 s of audio as log-mel features (batch, 80, 3000), the decoder prompt
`<|startoftranscript|><|en|><|transcribe|><|notimestamps|>` prefilled, then exactly `--new-tokens` tokens
decoded greedily over a static KV cache, end of text ignored (GreedyGeneration, models/nlp.py): the encoder runs
inside the prefill, so time to first token includes it. The cross-attention keys and values of the encoder's
output are computed once, in the prefill, into a static cache of their own that every decode step reads (the
encoder-decoder step and spec every such model shares: Seq2SeqStep, Seq2Seq in models/nlp.py).
"""

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..core.errors import UsageError
from .nlp import Encoder, Seq2Seq, Seq2SeqStep, load_transformers

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


class WhisperStep(Seq2SeqStep):
    """Whisper as a generation step over a static KV cache (Seq2SeqStep): the source is the log-mel features, the
    prompt the start-of-transcript tokens."""

    def __init__(self, model: nn.Module, tokenizer=None, feature_extractor=None):
        super().__init__(model, tokenizer, decoder_prompt(model, tokenizer))
        self.feature_extractor = feature_extractor
        generation, vocab = getattr(model, "generation_config", None), model.config.vocab_size

        def ids(name):
            return tuple(i for i in getattr(generation, name, None) or () if 0 <= i < vocab)

        self.suppressed, self.suppressed_first = ids("suppress_tokens"), ids("begin_suppress_tokens")

    def next_token(self, logits: torch.Tensor, generated: int) -> torch.Tensor:
        """Each row's next token as Whisper's greedy `generate` picks it: the highest logit once the generation
        config's suppress_tokens are set to -inf, and, for the first token (`generated` 0), its
        begin_suppress_tokens too (end of text and the bare space: a transcript does not start empty)."""
        banned = self.suppressed + self.suppressed_first if generated == 0 else self.suppressed
        if banned:
            logits = logits.index_fill(-1, torch.tensor(banned, device=logits.device), float("-inf"))
        return logits.argmax(-1)

    @property
    def frames(self) -> int:
        """Log-mel frames the encoder takes (3000: 30 s), two per encoder position (its stride-2 convolution)."""
        return 2 * self.model.config.max_source_positions


@dataclass(frozen=True)
class Whisper(Seq2Seq):
    """Whisper benchmarked as speech-to-text generation: throughput in generated tokens per second.

    Its shape is `new_tokens` alone: the audio is always the 30 s window the encoder takes, the prompt the
    4 start-of-transcript tokens (2 for an English-only folder). Random weights by default; `--model-dir` loads a
    local Whisper folder (WhisperForConditionalGeneration, with its tokenizer and feature extractor if there).
    """

    PROMPT_MAX = len(PROMPT_IDS)

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

    def _step(self, model, tokenizer=None):
        return WhisperStep(model, tokenizer)

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

    def example_inputs(self, batch_size, shape, module):
        """Fixed pseudo-random features in the range of Whisper's normalised log-mel (-1.5..1.5), and the prompt."""
        gen = torch.Generator().manual_seed(1234)
        mels = module.model.config.num_mel_bins
        features = torch.rand((batch_size, mels, module.frames), generator=gen) * 2 - 1
        return features, self.prompt(module, batch_size)

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

    def source_positions(self, shape):
        return self._config().max_source_positions

    def source_bytes(self, shape):
        """The log-mel features: two frames per encoder position."""
        config = self._config()
        return config.num_mel_bins * 2 * config.max_source_positions * 4
