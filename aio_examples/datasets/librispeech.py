"""LibriSpeech-style speech recognition: a folder of utterances and their transcripts, scored by word error rate.

The layout is LibriSpeech's (e.g. `test-clean`), searched recursively: transcript files
`SPEAKER/CHAPTER/SPEAKER-CHAPTER.trans.txt` of lines `SPEAKER-CHAPTER-UTTERANCE TEXT`, and each utterance's audio
beside its transcript file as `SPEAKER-CHAPTER-UTTERANCE.flac` (or `.wav`). Audio is read with soundfile (flac,
wav) when it is installed, else .wav with the standard library's `wave` (PCM); mixed down to mono, resampled to
16 kHz with scipy's polyphase `resample_poly`, and made Whisper's log-mel features by the model (models/speech.py,
WhisperFeatureExtractor: the first 30 s, silence after a shorter utterance).

Scoring follows the Whisper model cards' LibriSpeech evaluation: each batch is transcribed through the prepared
step (`drive`) as Whisper's greedy `generate` transcribes it, the prompt prefilled, then each next token the
highest logit once the generation config's `suppress_tokens` (and, for the first token, its
`begin_suppress_tokens`) are excluded, for `--new-tokens` tokens, each hypothesis ending at its first end of text
and decoded by the model folder's tokenizer; then the word error rate over the whole set (jiwer: substitutions,
deletions and insertions over the reference words) after Whisper's English text normalisation of both sides
(transformers' EnglishTextNormalizer, with the spelling map of the folder's normalizer.json: a folder without one,
such as a test's tiny tokenizer, is normalised without it, and the record's protocol says so). Lower is better.
Predictions: each utterance's id, its reference and the hypothesis as decoded.
"""

import importlib.util
import math
import wave
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..core.errors import UsageError
from .base import Evaluation, LabelledDataset, read_text, tokenizer_of

FORMAT = ("a LibriSpeech-style folder: SPEAKER/CHAPTER/SPEAKER-CHAPTER.trans.txt files of lines "
          "'SPEAKER-CHAPTER-UTTERANCE TEXT', each utterance's .flac or .wav beside them")
AUDIO_SUFFIXES = (".flac", ".wav")
SAMPLING_RATE = 16000
REFERENCE = ("Whisper's model-card LibriSpeech evaluation: greedy generate (the generation config's suppress_tokens "
             "and begin_suppress_tokens applied) until end of text, both sides normalised by transformers' "
             "EnglishTextNormalizer, jiwer's word error rate over the whole set")


class Utterance(NamedTuple):
    utterance: str
    text: str
    audio: Path


class LibriSpeech(LabelledDataset):
    name = "librispeech"
    tasks = ("speech-recognition",)
    path_kind = FORMAT
    needs_tokenizer = True

    def _index(self):
        if not self.path.is_dir():
            raise UsageError(f"librispeech dataset {str(self.path)!r} is not a folder; accepted: {FORMAT}")
        if self.labels:
            raise UsageError(f"librispeech dataset takes no --labels ({str(self.labels)!r}); accepted: {FORMAT}")
        if importlib.util.find_spec("jiwer") is None:
            raise UsageError("librispeech dataset scores word error rates with jiwer, which is not installed; "
                             "accepted: pip install jiwer")
        transcripts = sorted(self.path.rglob("*.trans.txt"))
        if not transcripts:
            raise UsageError(f"librispeech dataset {str(self.path)!r} has no *.trans.txt transcript file; "
                             f"accepted: {FORMAT}")
        samples, seen = [], set()
        for file in transcripts:
            for number, line in enumerate(read_text(file, FORMAT).splitlines(), 1):
                utterance, _, text = line.strip().partition(" ")
                if not utterance:
                    continue
                where = f"{str(file)!r} line {number}"
                if not text.strip():
                    raise UsageError(f"{where} is {line.strip()[:80]!r}, without a transcript; accepted: {FORMAT}")
                if utterance in seen:
                    raise UsageError(f"{where}: utterance {utterance!r} is transcribed twice; accepted: {FORMAT}")
                audio = next((file.parent / (utterance + s) for s in AUDIO_SUFFIXES
                              if (file.parent / (utterance + s)).is_file()), None)
                if audio is None:
                    raise UsageError(f"{where} names {utterance!r}, which has no {utterance}.flac or .wav beside "
                                     f"it; accepted: {FORMAT}")
                check_audio(audio)
                seen.add(utterance)
                samples.append(Utterance(utterance, " ".join(text.split()), audio))
        return samples

    def _describe_sample(self, sample):
        return [sample.utterance, sample.text, str(sample.audio.relative_to(self.path))]

    def batches(self, spec, batch_size, shape, module):
        self.shape = shape          # drive decodes as many tokens as the timed passes
        self.choose = getattr(module, "next_token", None)           # as the model's generate picks them
        return super().batches(spec, batch_size, shape, module)

    def _inputs(self, spec, shape, module, samples):
        if not hasattr(spec, "audio_inputs"):
            raise UsageError(f"dataset {self.name!r} needs a speech model (e.g. whisper_tiny); {spec.name} "
                             "takes no audio")
        return spec.audio_inputs(module, [read_audio(s.audio) for s in samples])

    def _target(self, sample):
        return (sample.utterance, sample.text)

    def drive(self, step, inputs):
        """A batch transcribed through the prepared step: the prompt (the last input, the features before it)
        prefilled, then `--new-tokens` tokens decoded greedily as Whisper's generate picks them
        (models/nlp.py: GreedyGeneration; models/speech.py: WhisperStep.next_token)."""
        import torch

        from ..models.nlp import GreedyGeneration

        with torch.no_grad():
            tokens, _ = GreedyGeneration(step, inputs[-1], self.shape["new_tokens"], context=inputs[:-1],
                                         choose=self.choose)()
        return [tokens.numpy()]

    def evaluation(self, spec, module):
        tokenizer = tokenizer_of(self, module)
        self.spelling_map = bool(spelling_map(tokenizer))
        return WordErrorRate(tokenizer.decode, tokenizer.eos_token_id, normaliser(tokenizer))

    def protocol(self, spec, shape):
        found = getattr(self, "spelling_map", None)         # known once an evaluation has seen the tokenizer
        spelling = {True: "with the model folder's spelling map (normalizer.json)",
                    False: "without a spelling map: the model folder has no normalizer.json, so British and American "
                           "spellings of a word count as different words"}.get(found)
        return {"protocol": "reference", "follows": REFERENCE, "shape": {"new_tokens": shape["new_tokens"]},
                **({"normaliser": f"EnglishTextNormalizer {spelling}"} if spelling else {})}


def check_audio(path: Path) -> None:
    """Read an audio file's header (not its samples): one line when it cannot be read as audio."""
    soundfile = _soundfile()
    try:
        if soundfile is not None:
            soundfile.info(str(path))
        elif path.suffix == ".wav":
            with wave.open(str(path), "rb"):
                pass
        else:
            raise UsageError(f"{str(path)!r} is {path.suffix} audio, which needs soundfile; accepted: pip install "
                             "soundfile, or .wav files")
    except (OSError, EOFError, RuntimeError, wave.Error) as exc:   # soundfile's LibsndfileError is a RuntimeError
        raise UsageError(f"{str(path)!r} cannot be read as audio ({_first_line(exc)}); accepted: {FORMAT}") from None


def read_audio(path: Path) -> np.ndarray:
    """An audio file's samples as float32 in -1..1, mono (channels averaged), at 16 kHz."""
    soundfile = _soundfile()
    try:
        if soundfile is not None:
            data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        else:
            data, rate = _read_wav(path)
    except (OSError, EOFError, RuntimeError, ValueError, wave.Error) as exc:
        raise UsageError(f"{str(path)!r} cannot be read as audio ({_first_line(exc)}); accepted: {FORMAT}") from None
    mono = data.mean(axis=1, dtype=np.float32)
    if rate != SAMPLING_RATE:
        from scipy.signal import resample_poly

        common = math.gcd(int(rate), SAMPLING_RATE)
        mono = resample_poly(mono, SAMPLING_RATE // common, int(rate) // common).astype(np.float32)
    return mono


def _read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A PCM .wav with the standard library: (frames x channels float32 in -1..1, sampling rate)."""
    with wave.open(str(path), "rb") as wav:
        channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
        raw = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.uint8)
    if width == 1:                                      # 8-bit PCM is unsigned
        samples = (raw.astype(np.float32) - 128) / 128
    elif width == 3:                                    # 24-bit: into the top of an int32
        padded = np.zeros((raw.size // 3, 4), dtype=np.uint8)
        padded[:, 1:] = raw.reshape(-1, 3)
        samples = padded.view("<i4").ravel().astype(np.float32) / 2**31
    elif width in (2, 4):
        samples = np.frombuffer(raw.tobytes(), dtype=f"<i{width}").astype(np.float32) / 2 ** (8 * width - 1)
    else:
        raise ValueError(f"{8 * width}-bit samples")
    return samples.reshape(-1, channels), rate


def _soundfile():
    try:
        import soundfile
    except (ImportError, OSError):          # OSError: the package without its libsndfile
        return None
    return soundfile


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]


def spelling_map(tokenizer) -> dict:
    """The British-to-American spelling map a Whisper tokenizer reads from its folder's normalizer.json ({} without)."""
    return getattr(tokenizer, "english_spelling_normalizer", None) or {}


def normaliser(tokenizer=None):
    """Whisper's English text normalisation (transformers' EnglishTextNormalizer: lower case, punctuation and
    filler words removed, numbers and spellings standardised, the spellings by the tokenizer's map when it has one),
    as the Whisper tokenizer's `normalize` applies it."""
    from ..models.nlp import load_transformers

    load_transformers()
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    return EnglishTextNormalizer(spelling_map(tokenizer))


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """jiwer's word error rate of a whole set: (substitutions + deletions + insertions) / reference words."""
    import jiwer

    return float(jiwer.wer(references, hypotheses))


class WordErrorRate(Evaluation):
    """Each row's tokens up to its first end of text, decoded (special tokens skipped), then the word error rate
    of all of them against the references, both normalised."""

    def __init__(self, decode, end_of_text: int | None, normalise):
        self.decode, self.end_of_text, self.normalise = decode, end_of_text, normalise
        self.utterances, self.references, self.hypotheses = [], [], []

    def add(self, batch, outputs):
        tokens = np.asarray(outputs[0])[:batch.count]
        for (utterance, reference), row in zip(batch.targets, tokens, strict=True):
            ids = [int(t) for t in row]
            if self.end_of_text in ids:
                ids = ids[:ids.index(self.end_of_text)]
            self.utterances.append(utterance)
            self.references.append(reference)
            self.hypotheses.append(self.decode(ids, skip_special_tokens=True).strip())

    def metrics(self):
        return {"wer": word_error_rate([self.normalise(r) for r in self.references],
                                       [self.normalise(h) for h in self.hypotheses])}

    def predictions(self):
        return [{"utterance": u, "reference": r, "hypothesis": h}
                for u, r, h in zip(self.utterances, self.references, self.hypotheses, strict=True)]
