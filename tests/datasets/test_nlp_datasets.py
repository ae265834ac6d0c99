"""The NLP datasets (squad, glue, masked-text) with a real tiny Hugging Face folder: a WordPiece tokenizer and
BERT heads small enough to run in milliseconds, loaded through the zoo's specs as `--model-dir` loads them."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from aio_examples.core.errors import UsageError
from aio_examples.datasets import metrics, open_dataset, resolve
from aio_examples.datasets.glue import Glue
from aio_examples.datasets.masked_text import MaskedText
from aio_examples.datasets.squad import MAX_ANSWER_TOKENS, Squad
from aio_examples.models import get_model
from aio_examples.models.nlp import EncoderModel

pytest_plugins = ["tiny_folders"]          # the tiny model folders' fixtures

CONTEXTS = [
    "Paris is the capital and largest city of France. It lies on the river Seine.",
    "The Amazon is the largest rainforest in the world. It covers much of Brazil and Peru.",
]
SQUAD = {"version": "1.1", "data": [
    {"title": "Paris", "paragraphs": [{"context": CONTEXTS[0], "qas": [
        {"id": "q1", "question": "What is the capital of France?",
         "answers": [{"text": "Paris", "answer_start": 0}]},
        {"id": "q2", "question": "Which river does Paris lie on?",
         "answers": [{"text": "the river Seine", "answer_start": 59}, {"text": "Seine", "answer_start": 69}]},
    ]}]},
    {"title": "Amazon", "paragraphs": [{"context": CONTEXTS[1], "qas": [
        {"id": "q3", "question": "What is the largest rainforest?",
         "answers": [{"text": "The Amazon", "answer_start": 0}]},
        {"id": "q4", "question": "Which countries does it cover?",
         "answers": [{"text": "Brazil and Peru", "answer_start": 69}]},
    ]}]},
]}
GLUE = ("sentence\tlabel\n"
        "a great and moving film\t1\n"
        "a dull , boring story\t0\n"
        "\n"
        "the best film of the year\t1\n"
        "the worst film of the year\t0\n"
        "a \"quoted\" story that is great\t1\n")
SENTENCES = ["Paris is the capital of France.", "", "The river runs through the city.",
             "The film was great and moving.", "It covers much of Brazil."]


def text_words():
    text = " ".join([json.dumps(SQUAD), GLUE, *SENTENCES]).lower()
    for mark in ".,?\"'{}[]:":
        text = text.replace(mark, f" {mark} ")
    return sorted(set(text.split()) | {"##s", "##ing", "##ed"})


@pytest.fixture(scope="module")
def folders(tiny_bert):
    """One local Hugging Face folder per head (tiny_folders.py): a tiny BERT with random weights and its tokenizer."""
    words = text_words()
    return {"qa": tiny_bert(words, "BertForQuestionAnswering"),
            "classification": tiny_bert(words, "BertForSequenceClassification", num_labels=2),
            "mlm": tiny_bert(words, "BertForMaskedLM")}


@pytest.fixture()
def squad_file(tmp_path):
    path = tmp_path / "dev-v1.1.json"
    path.write_text(json.dumps(SQUAD))
    return path


@pytest.fixture()
def glue_file(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text(GLUE)
    return path


@pytest.fixture()
def text_file(tmp_path):
    path = tmp_path / "sentences.txt"
    path.write_text("\n".join(SENTENCES) + "\n")
    return path


def run_all(ds, spec, module, batch_size, shape):
    """Every batch through the model and into a fresh evaluation, as the runner does; checks the padding."""
    evaluation, counts = ds.evaluation(spec, module), []
    for batch in ds.batches(spec, batch_size, shape, module):
        assert all(t.shape == (batch_size, shape["seq_len"]) and t.dtype == torch.int64 for t in batch.inputs)
        counts.append(batch.count)
        with torch.no_grad():
            out = module(*batch.inputs)
        evaluation.add(batch, [t.detach().float().numpy() for t in out])
    return evaluation, counts


def test_squad_runs_a_real_model_and_scores_every_question(folders, squad_file):
    spec = get_model("bert_base")
    shape = spec.shape(seq_len=48)
    module = spec.build(model_dir=str(folders["qa"]), shape=shape)
    ds = open_dataset("squad", str(squad_file))
    assert [s.qid for s in ds.samples] == ["q1", "q2", "q3", "q4"] and Squad.needs_tokenizer
    evaluation, counts = run_all(ds, spec, module, 3, shape)
    assert counts == [3, 1]
    scores = evaluation.metrics()
    assert set(scores) == {"exact_match", "f1"} and all(0.0 <= v <= 1.0 for v in scores.values())
    predictions = evaluation.predictions()
    assert list(predictions) == ["q1", "q2", "q3", "q4"]
    assert all(text in CONTEXTS[0 if q in ("q1", "q2") else 1] for q, text in predictions.items())
    json.dumps(predictions)
    assert ds.describe()["digest"] == open_dataset("squad", str(squad_file)).digest


def squad_batch(folders, squad_file, seq_len=48):
    spec = get_model("bert_base")
    module = spec.build(model_dir=str(folders["qa"]))
    ds = open_dataset("squad", str(squad_file))
    return ds, module, next(ds.batches(spec, 4, {"seq_len": seq_len}, module))


def answer_tokens(batch, row, text):
    """The first and last token of `text` in the context of `row`, found through the offsets."""
    question, offsets = batch.targets[row]
    start = question.context.index(text)
    tokens = [i for i, (s, e) in enumerate(offsets) if s >= 0 and s < start + len(text) and e > start]
    return tokens[0], tokens[-1]


def test_squad_logits_peaking_at_the_answer_give_its_text_and_full_marks(folders, squad_file):
    ds, module, batch = squad_batch(folders, squad_file)
    start, end = np.zeros((4, 48), np.float32), np.zeros((4, 48), np.float32)
    golds = ["Paris", "the river Seine", "The Amazon", "Brazil and Peru"]
    for row, gold in enumerate(golds):
        first, last = answer_tokens(batch, row, gold)
        start[row, first], end[row, last] = 5.0, 5.0
        start[row, 1] = end[row, 1] = 9.0                 # the question's first token: never an answer
    evaluation = ds.evaluation(None, module)
    evaluation.add(batch, [start, end])
    assert evaluation.predictions() == dict(zip(["q1", "q2", "q3", "q4"], golds, strict=True))
    assert evaluation.metrics() == {"exact_match": 1.0, "f1": 1.0}


def test_squad_spans_end_after_they_start_and_are_at_most_30_tokens(folders, tmp_path):
    long = " ".join(["paris"] * 40) + " seine"
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": long, "qas": [
        {"id": "x", "question": "river?", "answers": [{"text": "seine"}]}]}]}]}))
    ds, module, batch = squad_batch(folders, path, seq_len=64)
    _, offsets = batch.targets[0]
    context = [i for i, (s, _) in enumerate(offsets) if s >= 0]
    first, last = context[0], context[-1]
    assert last - first + 1 == 41 > MAX_ANSWER_TOKENS

    def answer(starts, ends):
        start, end = np.zeros((4, 64), np.float32), np.zeros((4, 64), np.float32)
        for token, value in starts.items():
            start[0, token] = value
        for token, value in ends.items():
            end[0, token] = value
        evaluation = ds.evaluation(None, module)
        evaluation.add(batch, [start, end])
        return evaluation

    too_long = answer({first: 10.0, last - 1: 1.0}, {last: 10.0})         # the 41-token span scores 20
    assert too_long.predictions() == {"x": "paris seine"}
    assert too_long.metrics() == {"exact_match": 0.0, "f1": pytest.approx(2 / 3)}
    backwards = answer({last: 10.0}, {first: 10.0, last: 1.0})            # end before start scores 20
    assert backwards.predictions() == {"x": "seine"} and backwards.metrics()["exact_match"] == 1.0


def test_squad_official_normalisation_and_f1():
    assert metrics.normalize_answer("The  Eiffel-Tower, in PARIS!") == "eiffeltower in paris"
    assert metrics.normalize_answer("an apple a day") == "apple day"
    answers = {"a": ["Eiffel Tower", "the tower"], "b": ["red barn in Kansas"], "c": ["Seine"], "d": ["1889"]}
    predictions = {"a": "the Tower.", "b": "big red barn", "c": "Seine river"}      # "d" unanswered: 0
    # a: exact against "the tower"; b: 2 shared of 3 predicted and 4 gold words -> F1 = 2 * (2/3 * 1/2) / (2/3 + 1/2)
    # c: 1 shared of 2 predicted and 1 gold -> 2 * (1/2 * 1) / (1/2 + 1) = 2/3
    scores = metrics.squad(predictions, answers)
    assert scores["exact_match"] == 0.25
    assert scores["f1"] == pytest.approx((1 + 4 / 7 + 2 / 3 + 0) / 4)


def test_glue_runs_a_real_classifier(folders, glue_file):
    spec = get_model("distilbert_base")
    shape = spec.shape(seq_len=16)
    module = spec.build(model_dir=str(folders["classification"]), shape=shape)
    ds = open_dataset("glue", str(glue_file))
    assert [s[1] for s in ds.samples] == [2, 3, 5, 6, 7] and Glue.needs_tokenizer    # file lines, blank skipped
    evaluation, counts = run_all(ds, spec, module, 2, shape)
    assert counts == [2, 2, 1]
    assert set(evaluation.metrics()) == {"accuracy"} and 0.0 <= evaluation.metrics()["accuracy"] <= 1.0
    predictions = evaluation.predictions()
    assert [p["index"] for p in predictions] == [0, 1, 2, 3, 4] and [p["label"] for p in predictions] == [1, 0, 1, 0, 1]
    assert all(p["predicted"] in (0, 1) for p in predictions)


def test_glue_accuracy_of_known_logits_and_sentence_pairs(folders, tmp_path):
    path = tmp_path / "rte.tsv"
    path.write_text("index\tsentence1\tsentence2\tlabel\n0\tparis is a city\tparis is great\t1\n"
                    "1\tthe film\tthe story\t0\n2\tthe river\tthe city\t1\n3\ta film\ta story\t0\n")
    spec = get_model("distilbert_base")
    module = spec.build(model_dir=str(folders["classification"]))
    ds = open_dataset("glue", str(path))
    batch = next(ds.batches(spec, 4, {"seq_len": 16}, module))
    tokenizer = module.tokenizer
    assert tokenizer.decode(batch.inputs[0][0], skip_special_tokens=True) == "paris is a city paris is great"
    assert (batch.inputs[0][0] == tokenizer.sep_token_id).sum() == 2                        # a pair
    evaluation = ds.evaluation(spec, module)
    evaluation.add(batch, [np.array([[0.1, 2.0], [3.0, 1.0], [5.0, -1.0], [0.5, 0.0]])])   # row 2 wrong
    assert evaluation.metrics() == {"accuracy": 0.75}
    assert evaluation.predictions()[2] == {"index": 2, "label": 1, "predicted": 0}


def test_masked_text_runs_a_real_masked_lm(folders, text_file):
    spec = get_model("roberta_base")
    shape = spec.shape(seq_len=16)
    module = spec.build(model_dir=str(folders["mlm"]), shape=shape)
    ds = open_dataset("masked-text", str(text_file))
    assert [n for n, _ in ds.samples] == [1, 3, 4, 5] and MaskedText.needs_tokenizer
    evaluation, counts = run_all(ds, spec, module, 3, shape)
    assert counts == [3, 1]
    scores = evaluation.metrics()
    assert set(scores) == {"top_1", "top_5"} and 0.0 <= scores["top_1"] <= scores["top_5"] <= 1.0
    first = evaluation.predictions()[0]
    # "paris is the capital of france ." -> 7 word pieces, the middle one (index 3) is "capital"
    assert first["line"] == 1 and first["masked"] == "paris is the [MASK] of france."
    assert first["expected"] == "capital" and isinstance(first["predicted"], str)


def test_masked_text_top_1_of_known_logits(folders, text_file):
    spec = get_model("roberta_base")
    module = spec.build(model_dir=str(folders["mlm"]))
    ds = open_dataset("masked-text", str(text_file))
    batch = next(ds.batches(spec, 4, {"seq_len": 16}, module))
    ids = batch.inputs[0]
    vocab = len(module.tokenizer.get_vocab())
    logits = np.zeros((4, 16, vocab), np.float32)
    expected = [module.tokenizer.convert_tokens_to_ids(t) for t in ("capital", "through", "great", "of")]
    for row, (_, position, token, _) in enumerate(batch.targets):
        assert ids[row, position] == module.tokenizer.mask_token_id and token == expected[row]
        logits[row, :, token] = 1.0                        # right everywhere...
        if row == 3:
            logits[row, position, token + 1] = 2.0         # ...but second at the mask in the last row
    evaluation = ds.evaluation(spec, module)
    evaluation.add(batch, [logits])
    assert evaluation.metrics() == {"top_1": 0.75, "top_5": 1.0}
    assert [p["expected"] for p in evaluation.predictions()] == ["capital", "through", "great", "of"]


@pytest.mark.parametrize("kind", ["squad", "glue", "masked-text"])
def test_every_kind_needs_a_tokenizer(folders, kind, squad_file, glue_file, text_file):
    path = {"squad": squad_file, "glue": glue_file, "masked-text": text_file}[kind]
    bare = EncoderModel(get_model("bert_base").build(model_dir=str(folders["qa"])).model)     # no tokenizer
    ds = open_dataset(kind, str(path))
    with pytest.raises(UsageError, match=f"^dataset '{kind}' needs a tokenizer; accepted: --model-dir"):
        next(ds.batches(None, 2, {"seq_len": 16}, bare))


def test_squad_question_longer_than_seq_len_is_a_usage_error(folders, squad_file):
    with pytest.raises(UsageError, match=r"^--seq-len 6 leaves 0 context tokens beside squad question 'q\d', not "
                                         r"more than the document stride of 2; accepted: a --seq-len of at least \d+$"):
        squad_batch(folders, squad_file, seq_len=6)


SQUAD_V2 = json.dumps({"version": "v2.0", "data": [{"paragraphs": [{"context": "c", "qas": [
    {"id": "a", "question": "q", "answers": [], "is_impossible": True}]}]}]})

SQUAD_TWICE = json.dumps({"data": [{"paragraphs": [{"context": "c", "qas": [
    {"id": "a", "question": "q", "answers": [{"text": "c"}]}] * 2}]}]})


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("kind, name, text, message", [
    ("squad", "missing.json", None, r"squad dataset '.*missing\.json' does not exist; accepted: a SQuAD v1\.1 JSON"),
    ("squad", "dev.json", "{not json", r"'.*dev\.json' is not JSON \(line 1\); accepted: a SQuAD v1\.1 JSON file"),
    ("squad", "dev.json", '{"images": []}', r"'.*dev\.json' is not a SQuAD file \(no 'data' list\); accepted"),
    ("squad", "dev.json", '{"data": [{"title": "x"}]}',
     r"'.*dev\.json' is not a SQuAD file \(no 'paragraphs' at question 1\); accepted"),
    ("squad", "dev.json", SQUAD_V2, r"question 'a' has no answer \(a SQuAD v2\.0 file\?\)"),
    ("squad", "dev.json", "", r"'.*dev\.json' is not JSON"),
    ("squad", "dev.json", SQUAD_TWICE, r"'.*dev\.json' has question id 'a' twice; accepted"),
    ("squad", "dev.json", '{"data": []}', r"squad dataset '.*dev\.json' holds no samples"),
    ("glue", "dev.tsv", "", r"'.*dev\.tsv' is empty \(line 1 has no header\); accepted: a tab-separated file"),
    ("glue", "dev.tsv", "sentence\tlabel\n", r"glue dataset '.*dev\.tsv' holds no samples"),
    ("glue", "dev.tsv", "sentence\tscore\nfine\t1\n",
     r"'.*dev\.tsv' line 1 has no 'label' column \(header: 'sentence score'\); accepted: .*'label' column"),
    ("glue", "dev.tsv", "text\tlabel\nfine\t1\n",
     r"'.*dev\.tsv' line 1 has no text columns .*accepted: .*sentence1\+sentence2"),
    ("glue", "dev.tsv", "sentence\tlabel\nfine\t1\nbad\tpositive\n",
     r"'.*dev\.tsv' line 3: label 'positive' is not a class number; accepted"),
    ("glue", "dev.tsv", "sentence1\tsentence2\tlabel\na\tb\t1\nonly one\n",
     r"'.*dev\.tsv' line 3 has 1 of the header's 3 fields"),
    ("masked-text", "lines.txt", "", r"masked-text dataset '.*lines\.txt' holds no samples; accepted: a UTF-8 text"),
    ("masked-text", "lines.txt", "\n  \n\n", r"masked-text dataset '.*lines\.txt' holds no samples"),
    ("masked-text", "folder", "dir", r"masked-text dataset '.*folder' is not a file; accepted: a UTF-8 text file"),
])
def test_malformed_files_fail_on_opening_in_one_line(tmp_path, kind, name, text, message):
    path = tmp_path / name
    if text == "dir":
        path.mkdir()
    elif text is not None:
        path.write_text(text)
    with pytest.raises(UsageError, match=message) as caught:
        open_dataset(kind, str(path))
    assert "\n" not in str(caught.value)


def test_binary_text_file_and_labels_are_refused(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(UsageError, match=r"'.*lines\.txt' cannot be read \(UnicodeDecodeError\)"):
        open_dataset("masked-text", str(path))
    with pytest.raises(UsageError, match="squad dataset takes no --labels"):
        open_dataset("squad", write(tmp_path, "dev.json", json.dumps(SQUAD)), labels=str(path))


def test_each_kind_is_picked_by_its_variable_and_refused_for_another_task(squad_file, glue_file, text_file):
    assert isinstance(resolve("question-answering", environ={"SQUAD_V1_1_PATH": str(squad_file)}), Squad)
    assert isinstance(resolve("text-classification", environ={"GLUE_TSV_PATH": str(glue_file)}), Glue)
    assert isinstance(resolve("fill-mask", environ={"MASKED_TEXT_PATH": str(text_file)}), MaskedText)
    assert resolve("fill-mask", environ={"SQUAD_V1_1_PATH": str(squad_file)}).name == "synthetic"
    assert resolve("question-answering", dataset="squad", environ={"SQUAD_V1_1_PATH": str(squad_file)}).name == "squad"
    with pytest.raises(UsageError, match=r"^dataset 'squad' is for question-answering, not text-classification; "
                                         r"accepted: synthetic, glue$"):
        resolve("text-classification", dataset="squad:" + str(squad_file))
    assert resolve("question-answering", dataset="squad:" + str(squad_file), num_samples=2).samples[-1].qid == "q2"


def test_squad_through_the_runner_gives_every_backend_the_segment_ids_and_eager_fp32s_scores(folders, squad_file,
                                                                                               tmp_path):
    """At 24 tokens the contexts take two windows each: fixed-shape backends score them as eager does."""
    from aio_examples.machine.threads import ThreadChoice
    from aio_examples.measurement.runner import RunRequest, run
    from aio_examples.measurement.timing import StopRule

    spec = get_model("bert_base")
    ds = open_dataset("squad", str(squad_file))
    module = spec.build(model_dir=str(folders["qa"]))
    assert len(next(ds.batches(spec, 2, {"seq_len": 24}, module)).inputs) == 3      # ids, mask, segments
    windows = len(ds.samples)
    assert windows > len(ds.questions) == 4
    records = run(RunRequest(spec, ["eager", "onnxruntime", "openvino"], "fp32", 2, ThreadChoice(1, "--threads"),
                             {"seq_len": 24}, model_dir=str(folders["qa"]), rule=StopRule(timeout_s=0.2), dataset=ds),
                  tmp_path)
    for r in records:
        assert r.status == "ok", (r.backend, r.reason)
        assert r.accuracy["samples"] == windows and r.accuracy["delta_vs_eager_fp32"] == {"exact_match": 0.0, "f1": 0.0}
        assert set(json.loads(Path(r.accuracy["predictions"]).read_text())) == {"q1", "q2", "q3", "q4"}
        assert r.accuracy["protocol"]["shape"] == {"seq_len": 24, "doc_stride": 8}


def test_a_text_dataset_without_a_model_folder_is_refused_before_building(squad_file):
    from aio_examples.machine.threads import ThreadChoice
    from aio_examples.measurement.runner import RunRequest

    with pytest.raises(UsageError, match="dataset 'squad' needs text tokenized as the model was trained"):
        RunRequest(get_model("bert_base"), ["eager"], "fp32", 1, ThreadChoice(1, "--threads"), {"seq_len": 48},
                   dataset=open_dataset("squad", str(squad_file)))
