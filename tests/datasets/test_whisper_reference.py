"""Whisper's word error rate as its model cards compute it on LibriSpeech: the harness's transcripts and WER against
transformers' own `generate` (greedy), the tokenizer's decoding, Whisper's English text normaliser and jiwer, run
here on a tiny Whisper folder (tiny_folders.py) whose transcripts depend on the audio."""

import json
import shutil

import jiwer
import numpy as np
import pytest
import soundfile
import torch

from aio_examples.datasets import open_dataset
from aio_examples.datasets.librispeech import normaliser
from aio_examples.models import get_model
from aio_examples.models.nlp import GreedyGeneration, load_transformers

pytest_plugins = ["tiny_folders"]          # the tiny model folders' fixtures

NEW_TOKENS = 16
TRANSCRIPTS = {"84-121123-0000": "GO DO YOU HEAR", "84-121123-0001": "BUT IN LESS THAN FIVE MINUTES THE STAIRCASE",
               "84-121123-0002": "AT THE COLOUR OF HIS FACE", "84-121123-0003": "TWENTY ONE YEARS LATER",
               "84-121123-0004": "MISTER MORREL WAS THERE", "84-121123-0005": "HE HAD SEEN THE SEA"}


@pytest.fixture(scope="module")
def utterances(tmp_path_factory):
    """Six 16 kHz utterances: tones of different pitch and length in noise, written as flac."""
    folder = tmp_path_factory.mktemp("test-clean") / "84" / "121123"
    folder.mkdir(parents=True)
    (folder / "84-121123.trans.txt").write_text("".join(f"{u} {t}\n" for u, t in TRANSCRIPTS.items()))
    rng = np.random.default_rng(11)
    for i, utterance in enumerate(TRANSCRIPTS):
        t = np.arange(int((0.6 + 0.3 * i) * 16000)) / 16000
        audio = 0.3 * np.sin(2 * np.pi * (150 + 110 * i) * t) + rng.normal(0, 0.05, len(t))
        soundfile.write(folder / f"{utterance}.flac", audio.astype(np.float32), 16000)
    return folder.parent.parent


def harness(folder, utterances, choose=True):
    """The dataset's transcripts and WER through the eager step (`choose` False: plain argmax instead)."""
    spec = get_model("whisper_tiny")
    module = spec.build(model_dir=str(folder))
    ds = open_dataset("librispeech", str(utterances))
    evaluation = ds.evaluation(spec, module)
    for batch in ds.batches(spec, 2, spec.shape(new_tokens=NEW_TOKENS), module):
        if not choose:
            ds.choose = None
        evaluation.add(batch, ds.drive(module, batch.inputs))
    return ds, evaluation


def reference(folder, utterances):
    """The model card's evaluation: features by the folder's extractor, greedy `generate` in English, the
    tokenizer's decoding, its normaliser on both sides (its spelling map, or none: the tokenizer itself fails
    without one), jiwer's WER over the set."""
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    tf = load_transformers()
    extractor = tf.WhisperFeatureExtractor.from_pretrained(folder)
    model = tf.WhisperForConditionalGeneration.from_pretrained(folder).eval()
    tokenizer = tf.AutoTokenizer.from_pretrained(folder)
    normalise = EnglishTextNormalizer(tokenizer.english_spelling_normalizer or {})
    names = sorted(TRANSCRIPTS)
    hypotheses = []
    for first in range(0, len(names), 2):       # the harness's batches of two
        audio = [soundfile.read(next(utterances.rglob(f"{n}.flac")), dtype="float32")[0] for n in names[first:first + 2]]
        features = extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
        features = features[..., :2 * model.config.max_source_positions]
        with torch.no_grad():
            ids = model.generate(features, language="en", task="transcribe", max_new_tokens=NEW_TOKENS)
        hypotheses += tokenizer.batch_decode(ids, skip_special_tokens=True)
    references = [normalise(TRANSCRIPTS[n]) for n in names]
    return [h.strip() for h in hypotheses], jiwer.wer(references, [normalise(h) for h in hypotheses])


def test_transcripts_and_word_error_rate_are_generates(whisper_folder, utterances):
    hypotheses, wer = reference(whisper_folder, utterances)
    _, evaluation = harness(whisper_folder, utterances)
    assert [p["hypothesis"] for p in evaluation.predictions()] == hypotheses
    assert evaluation.metrics() == {"wer": pytest.approx(wer)}
    assert len(set(hypotheses)) > 1                              # the transcripts depend on the audio
    # what makes generate's choice Whisper's: without its suppressed tokens some transcripts differ
    _, plain = harness(whisper_folder, utterances, choose=False)
    assert [p["hypothesis"] for p in plain.predictions()] != hypotheses


def test_the_record_says_which_normaliser_scored(whisper_folder, utterances, tmp_path):
    """The tiny folder has no normalizer.json: British spellings stay; with one, they are mapped, as the
    tokenizer's `normalize` maps them."""
    ds, _ = harness(whisper_folder, utterances)
    protocol = ds.protocol(get_model("whisper_tiny"), {"new_tokens": NEW_TOKENS})
    assert protocol["protocol"] == "reference" and protocol["shape"] == {"new_tokens": NEW_TOKENS}
    assert protocol["normaliser"].startswith("EnglishTextNormalizer without a spelling map")
    assert normaliser(ds_tokenizer(whisper_folder))("COLOUR") == "colour"

    mapped = tmp_path / "whisper-with-map"
    shutil.copytree(whisper_folder, mapped)
    (mapped / "normalizer.json").write_text(json.dumps({"colour": "color"}))
    ds, evaluation = harness(mapped, utterances)
    assert ds.protocol(None, {"new_tokens": NEW_TOKENS})["normaliser"] == (
        "EnglishTextNormalizer with the model folder's spelling map (normalizer.json)")
    tokenizer = ds_tokenizer(mapped)
    assert normaliser(tokenizer)("AT THE COLOUR") == tokenizer.normalize("AT THE COLOUR") == "at the color"
    assert evaluation.metrics() == {"wer": pytest.approx(reference(mapped, utterances)[1])}


def ds_tokenizer(folder):
    return load_transformers().AutoTokenizer.from_pretrained(folder)


def test_a_first_token_is_never_end_of_text_or_a_space(whisper_folder):
    """begin_suppress_tokens at the first step only, suppress_tokens at every step."""
    module = get_model("whisper_tiny").build(model_dir=str(whisper_folder))
    tokenizer = module.tokenizer
    eot, space = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("Ġ")
    logits = torch.zeros(2, len(tokenizer))
    logits[0, eot], logits[1, space], logits[:, 0] = 3.0, 3.0, 9.0         # token 0 ("!") is always suppressed
    logits[:, 7] = 1.0
    assert module.next_token(logits, 0).tolist() == [7, 7]
    assert module.next_token(logits, 1).tolist() == [eot, space]
    step = GreedyGeneration(module, torch.tensor([module.prompt_ids]), 3,
                            context=(torch.zeros(1, 80, module.frames),), choose=module.next_token)
    with torch.no_grad():
        tokens, _ = step()
    assert tokens[0, 0] not in (eot, space) and 0 not in tokens
