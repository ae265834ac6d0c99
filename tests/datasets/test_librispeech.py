"""The librispeech dataset: a LibriSpeech-style folder of real .wav files written here, a real tiny Whisper folder
(tiny_folders.py) loaded as `--model-dir` loads it, word error rates of known transcripts, and malformed folders
refused in one line."""

import json
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile

from aio_examples.core.errors import UsageError
from aio_examples.datasets import Batch, open_dataset, resolve
from aio_examples.datasets.librispeech import _read_wav, normaliser, read_audio, word_error_rate
from aio_examples.machine.threads import ThreadChoice
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.timing import StopRule
from aio_examples.models import get_model
from aio_examples.models.speech import PROMPT_TOKENS

pytest_plugins = ["tiny_folders"]          # the tiny model folders' fixtures

TRANSCRIPTS = {
    "1089/134686": {"1089-134686-0000": "HE HOPED THERE WOULD BE STEW FOR DINNER",
                    "1089-134686-0001": "STUFF IT INTO YOU HIS BELLY COUNSELLED HIM"},
    "121/121726": {"121-121726-0000": "ALSO A POPULAR CONTRIVANCE"},
}


def write_wav(path, samples: np.ndarray, rate: int, width: int = 2) -> None:
    """Samples in -1..1 (frames x channels) as a PCM .wav of `width` bytes a sample, with the standard library."""
    samples = samples.reshape(len(samples), -1)
    ints = np.round(np.clip(samples, -1, 1 - 2 ** -(8 * width - 1)) * 2 ** (8 * width - 1)).astype("<i4")
    data = ints.astype("<i2").tobytes() if width == 2 else ints.view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(samples.shape[1])
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(data)


def tone(seconds: float, rate: int, hz: float, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(int(hz)).normal(0, 0.05, (len(t), channels))
    return 0.5 * np.sin(2 * np.pi * hz * t)[:, None] + noise


@pytest.fixture()
def librispeech(tmp_path):
    """Three utterances in two chapters: 16 kHz 16-bit mono, 8 kHz stereo, 16 kHz 24-bit."""
    root = tmp_path / "test-clean"
    formats = [(16000, 1, 2), (8000, 2, 2), (16000, 1, 3)]
    for chapter, lines in TRANSCRIPTS.items():
        folder = root / chapter
        folder.mkdir(parents=True)
        (folder / f"{chapter.replace('/', '-')}.trans.txt").write_text(
            "".join(f"{u} {text}\n" for u, text in lines.items()))
        for utterance in lines:
            rate, channels, width = formats.pop(0)
            write_wav(folder / f"{utterance}.wav", tone(1.5, rate, 220 + 110 * len(formats), channels), rate, width)
    return root


def test_whisper_folder_transcribes_the_dataset_and_every_backend_gets_a_word_error_rate(librispeech, whisper_folder,
                                                                                        tmp_path):
    spec = get_model("whisper_tiny")
    dataset = open_dataset("librispeech", str(librispeech))
    assert [s.utterance for s in dataset.samples] == ["1089-134686-0000", "1089-134686-0001", "121-121726-0000"]
    [r] = run(RunRequest(spec, ["eager"], "fp32", 2, ThreadChoice(1, "--threads"), spec.shape(new_tokens=6),
                         model_dir=str(whisper_folder), dataset=dataset, rule=StopRule(timeout_s=0.2)), tmp_path)
    assert r.status == "ok", r.reason
    assert r.dataset == "librispeech" and r.metrics["generation"]["prompt_tokens"] == 4
    accuracy = r.accuracy
    assert accuracy["samples"] == 3 and accuracy["metrics"]["wer"] >= 0.5       # random weights: mostly wrong
    assert accuracy["delta_vs_eager_fp32"] == {"wer": 0.0}
    assert accuracy["dataset"]["kind"] == "librispeech" and len(accuracy["dataset"]["digest"]) == 16
    assert accuracy["protocol"]["shape"] == {"new_tokens": 6}        # the tiny folder has no spelling map:
    assert accuracy["protocol"]["normaliser"].startswith("EnglishTextNormalizer without a spelling map")
    predictions = json.loads(Path(accuracy["predictions"]).read_text())
    assert [p["reference"] for p in predictions] == [t for lines in TRANSCRIPTS.values() for t in lines.values()]
    assert all(isinstance(p["hypothesis"], str) for p in predictions)


def test_word_error_rate_of_known_tokens_stops_at_end_of_text_and_normalises(librispeech, whisper_folder):
    spec = get_model("whisper_tiny")
    module = spec.build(model_dir=str(whisper_folder))
    tokenizer = module.tokenizer
    assert module.prompt_ids == tokenizer.convert_tokens_to_ids(list(PROMPT_TOKENS))
    evaluation = open_dataset("librispeech", str(librispeech)).evaluation(spec, module)

    def tokens(*texts):
        rows = [tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] + tokenizer.encode(" junk")
                for t in texts]
        width = max(map(len, rows))
        return np.array([row + [tokenizer.eos_token_id] * (width - len(row)) for row in rows])

    # one substitution in four words ("their"), punctuation and case normalised away; the padded third row unscored
    batch = Batch((), [("a", "HE HOPED THERE WOULD"), ("b", "ALSO A POPULAR CONTRIVANCE")])
    evaluation.add(batch, [tokens(" He hoped their would.", " also, a popular contrivance!", " padding")])
    assert evaluation.metrics() == {"wer": pytest.approx(1 / 8)}
    assert [p["hypothesis"] for p in evaluation.predictions()] == ["He hoped their would.",
                                                                    "also, a popular contrivance!"]


def test_jiwer_word_error_rates_by_hand():
    assert word_error_rate(["a b c d"], ["a x c d"]) == 0.25                # one substitution in four words
    assert word_error_rate(["a b c d"], ["a c d"]) == 0.25                  # one deletion
    assert word_error_rate(["a b c d"], ["a b c d e f"]) == 0.5             # two insertions
    assert word_error_rate(["a b", "c d e f"], ["a b", ""]) == pytest.approx(4 / 6)    # over the whole set
    normalise = normaliser()
    assert normalise("HE HOPED, UH, THERE'D BE STEW.") == normalise("he hoped there would be stew")


def test_audio_is_read_as_16_khz_mono_and_the_standard_library_reads_pcm_wav_alike(librispeech):
    files = sorted(librispeech.rglob("*.wav"))
    stereo_8k = next(f for f in files if f.name == "1089-134686-0001.wav")
    assert read_audio(stereo_8k).shape == (24000,) and read_audio(stereo_8k).dtype == np.float32
    for path in files:                                  # 16-bit mono, 16-bit stereo, 24-bit
        ours, rate = _read_wav(path)
        theirs, their_rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        assert rate == their_rate and ours.shape == theirs.shape
        assert np.abs(ours - theirs).max() < 1e-6


def test_a_speech_dataset_is_picked_by_its_variable_needs_a_tokenizer_and_serves_speech_only(librispeech):
    dataset = resolve("speech-recognition", environ={"LIBRISPEECH_DATASET_PATH": str(librispeech)})
    assert dataset.name == "librispeech" and len(dataset.samples) == 3
    assert resolve("text-generation", environ={"LIBRISPEECH_DATASET_PATH": str(librispeech)}).name != "librispeech"
    with pytest.raises(UsageError, match="dataset 'librispeech' is for speech-recognition, not text-generation"):
        resolve("text-generation", f"librispeech:{librispeech}")
    with pytest.raises(UsageError, match="needs text tokenized as the model was trained; accepted: --model-dir"):
        RunRequest(get_model("whisper_tiny"), ["eager"], "fp32", 1, ThreadChoice(1, "--threads"), {"new_tokens": 4},
                   dataset=dataset)


def _damaged(root, kind):
    """The dataset's path after one kind of damage."""
    chapter, other = root / "1089" / "134686", root / "121" / "121726"
    if kind == "a file":
        return chapter / "1089-134686.trans.txt"
    if kind == "no transcripts":
        (chapter / "empty").mkdir()
        return chapter / "empty"
    if kind == "missing audio":
        (chapter / "1089-134686-0001.wav").unlink()
    elif kind == "unreadable audio":
        (other / "121-121726-0000.wav").write_bytes(b"RIFF not audio")
    elif kind == "no text":
        (other / "121-121726.trans.txt").write_text("121-121726-0000\n")
    elif kind == "twice":
        (other / "121-121726.trans.txt").write_text("1089-134686-0000 AGAIN\n")
    return root


@pytest.mark.parametrize(("kind", "message"), [
    ("a file", "is not a folder"),
    ("no transcripts", "has no *.trans.txt transcript file"),
    ("missing audio", "line 2 names '1089-134686-0001', which has no 1089-134686-0001.flac or .wav beside it"),
    ("unreadable audio", "121-121726-0000.wav' cannot be read as audio"),
    ("no text", "line 1 is '121-121726-0000', without a transcript"),
    ("twice", "utterance '1089-134686-0000' is transcribed twice"),
])
def test_malformed_folders_fail_on_opening_in_one_line(librispeech, kind, message):
    with pytest.raises(UsageError) as raised:
        open_dataset("librispeech", str(_damaged(librispeech, kind)))
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_labels_are_refused(librispeech):
    with pytest.raises(UsageError, match="takes no --labels"):
        open_dataset("librispeech", str(librispeech), labels=str(librispeech))


def test_a_rise_of_the_word_error_rate_is_the_loss_the_verdict_bounds():
    from aio_examples.measurement import accuracy

    def block(reference, found):
        return {"metrics": {"wer": found}, "reference": {"wer": reference},
                "delta_vs_eager_fp32": {"wer": round(found - reference, 6)}}

    assert accuracy.verdict(block(0.10, 0.13), "int8") is not None          # 3 points more errors
    assert accuracy.verdict(block(0.10, 0.07), "int8") is None              # fewer errors: no loss
    assert accuracy.verdict(block(0.10, 0.10), "fp32") is None
