"""SQuAD scored as Hugging Face's question-answering evaluation scores it: the harness's answers against a port of
transformers' examples/pytorch/question-answering (`prepare_validation_features`, `postprocess_qa_predictions`)
and of SQuAD v1.1's evaluate-v1.1.py, run here on a tiny BERT with random weights over contexts several windows
long."""

import collections
import json
import re
import string

import numpy as np
import pytest
import torch

from aio_examples.datasets import open_dataset
from aio_examples.datasets.squad import NO_ANSWER, doc_stride
from aio_examples.models import get_model
from aio_examples.models.nlp import load_transformers

pytest_plugins = ["tiny_folders"]          # the tiny model folders' fixtures

SEQ_LEN = 48
PARAGRAPHS = [
    (("The river Seine flows through Paris . It rises near Dijon and runs north west to the sea at Le Havre . "
     "Many bridges cross it in the city , and boats carry visitors along its banks past the old cathedral . "
     "Its basin drains much of northern France and its floods were once feared by the people of Paris ."),
     [("s1", "Where does the Seine rise ?", ["near Dijon"]),
      ("s2", "Where does the river reach the sea ?", ["at Le Havre", "Le Havre"]),
      ("s3", "What did the people of Paris fear ?", ["its floods"])]),
    (("The Amazon is the largest rainforest in the world . It covers much of Brazil and Peru and holds "
     "more kinds of trees and birds than any other forest . Its river carries more water than any other ."),
     [("a1", "Which countries does the forest cover ?", ["Brazil and Peru"]),
      ("a2", "What does the river carry ?", ["more water than any other"])]),
    ("Mount Fuji is the highest mountain of Japan .",
     [("f1", "What is the highest mountain of Japan ?", ["Mount Fuji"])]),
]
DATA = {"version": "1.1", "data": [{"title": f"t{i}", "paragraphs": [{"context": context, "qas": [
    {"id": qid, "question": question, "answers": [{"text": a, "answer_start": context.index(a)} for a in answers]}
    for qid, question, answers in qas]}]} for i, (context, qas) in enumerate(PARAGRAPHS)]}


@pytest.fixture(scope="module")
def qa_folder(tiny_bert):
    words = sorted({w.lower() for context, qas in PARAGRAPHS for text in [context, *(q for _, q, _ in qas)]
                    for w in text.split()})
    return tiny_bert(words, "BertForQuestionAnswering")


@pytest.fixture()
def squad_file(tmp_path):
    path = tmp_path / "dev-v1.1.json"
    path.write_text(json.dumps(DATA))
    return path


# --- the reference, ported -----------------------------------------------------------------------------------

def prepare_validation_features(tokenizer, examples, max_seq_length, stride):
    """transformers' run_qa.py: question and context in windows of `max_seq_length` sharing `stride` tokens; the
    offsets of tokens outside the context set to None; each window's example id."""
    pad_on_right = tokenizer.padding_side == "right"
    questions = [e["question"].lstrip() for e in examples]
    contexts = [e["context"] for e in examples]
    features = tokenizer(questions if pad_on_right else contexts, contexts if pad_on_right else questions,
                         truncation="only_second" if pad_on_right else "only_first", max_length=max_seq_length,
                         stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                         padding="max_length")
    sample_mapping = features.pop("overflow_to_sample_mapping")
    features["example_id"] = []
    for i in range(len(features["input_ids"])):
        sequence_ids = features.sequence_ids(i)
        context_index = 1 if pad_on_right else 0
        features["example_id"].append(examples[sample_mapping[i]]["id"])
        features["offset_mapping"][i] = [o if sequence_ids[k] == context_index else None
                                         for k, o in enumerate(features["offset_mapping"][i])]
    return features


def postprocess_qa_predictions(examples, features, all_start_logits, all_end_logits, n_best_size=20,
                               max_answer_length=30):
    """transformers' utils_qa.py for SQuAD v1 (no null answer): each example's best-scoring span over the n-best
    start and end indices of all its features."""
    features_per_example = collections.defaultdict(list)
    for i, example_id in enumerate(features["example_id"]):
        features_per_example[example_id].append(i)
    all_predictions = collections.OrderedDict()
    for example in examples:
        prelim_predictions = []
        for feature_index in features_per_example[example["id"]]:
            start_logits = all_start_logits[feature_index]
            end_logits = all_end_logits[feature_index]
            offset_mapping = features["offset_mapping"][feature_index]
            start_indexes = np.argsort(start_logits)[-1: -n_best_size - 1: -1].tolist()
            end_indexes = np.argsort(end_logits)[-1: -n_best_size - 1: -1].tolist()
            for start_index in start_indexes:
                for end_index in end_indexes:
                    if (start_index >= len(offset_mapping) or end_index >= len(offset_mapping)
                            or offset_mapping[start_index] is None or len(offset_mapping[start_index]) < 2
                            or offset_mapping[end_index] is None or len(offset_mapping[end_index]) < 2):
                        continue
                    if end_index < start_index or end_index - start_index + 1 > max_answer_length:
                        continue
                    prelim_predictions.append({
                        "offsets": (offset_mapping[start_index][0], offset_mapping[end_index][1]),
                        "score": start_logits[start_index] + end_logits[end_index]})
        predictions = sorted(prelim_predictions, key=lambda x: x["score"], reverse=True)[:n_best_size]
        context = example["context"]
        for pred in predictions:
            offsets = pred.pop("offsets")
            pred["text"] = context[offsets[0]: offsets[1]]
        if len(predictions) == 0 or (len(predictions) == 1 and predictions[0]["text"] == ""):
            predictions.insert(0, {"text": "empty", "score": 0.0})
        all_predictions[example["id"]] = predictions[0]["text"]
    return all_predictions


def official_evaluate(dataset, predictions):
    """SQuAD v1.1's evaluate-v1.1.py (as fractions)."""
    def normalize_answer(s):
        s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())

    def f1_score(prediction, ground_truth):
        prediction_tokens, ground_truth_tokens = normalize_answer(prediction).split(), normalize_answer(ground_truth).split()
        num_same = sum((collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)).values())
        if num_same == 0:
            return 0
        precision, recall = num_same / len(prediction_tokens), num_same / len(ground_truth_tokens)
        return (2 * precision * recall) / (precision + recall)

    f1 = exact_match = total = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                truths = [a["text"] for a in qa["answers"]]
                prediction = predictions[qa["id"]]
                exact_match += max(normalize_answer(prediction) == normalize_answer(t) for t in truths)
                f1 += max(f1_score(prediction, t) for t in truths)
    return {"exact_match": exact_match / total, "f1": f1 / total}


def reference_answers(folder, data, seq_len):
    tf = load_transformers()
    tokenizer = tf.AutoTokenizer.from_pretrained(folder)
    model = tf.AutoModelForQuestionAnswering.from_pretrained(folder).eval()
    examples = [{"id": qa["id"], "question": qa["question"], "context": p["context"]}
                for article in data["data"] for p in article["paragraphs"] for qa in p["qas"]]
    features = prepare_validation_features(tokenizer, examples, seq_len, seq_len // 3)
    inputs = {k: torch.tensor(features[k]) for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        out = model(**inputs)
    return postprocess_qa_predictions(examples, features, out.start_logits.numpy(), out.end_logits.numpy()), features


def harness_answers(folder, path, seq_len, batch_size=3):
    spec = get_model("bert_base")
    module = spec.build(model_dir=str(folder))
    ds = open_dataset("squad", str(path))
    evaluation = ds.evaluation(spec, module)
    for batch in ds.batches(spec, batch_size, {"seq_len": seq_len}, module):
        with torch.no_grad():
            out = module(*batch.inputs)
        evaluation.add(batch, [t.numpy() for t in out])
    return ds, evaluation


# --- the comparisons --------------------------------------------------------------------------------------------

def test_answers_and_scores_are_the_references_over_contexts_of_several_windows(qa_folder, squad_file):
    expected, features = reference_answers(qa_folder, DATA, SEQ_LEN)
    windows = collections.Counter(features["example_id"])
    assert max(windows.values()) >= 3 and min(windows.values()) == 1      # long contexts cut, short ones whole
    ds, evaluation = harness_answers(qa_folder, squad_file, SEQ_LEN)
    assert len(ds.samples) == len(features["example_id"]) and len(ds.questions) == 6
    assert evaluation.predictions() == expected
    assert len(set(expected.values())) > 1                                 # the answers depend on the inputs
    assert evaluation.metrics() == pytest.approx(official_evaluate(DATA["data"], expected))
    assert ds.protocol(get_model("bert_base"), {"seq_len": SEQ_LEN}) == {
        "protocol": "reference", "follows": ds.protocol(None, {"seq_len": 384})["follows"],
        "shape": {"seq_len": SEQ_LEN, "doc_stride": 16}, "reference_shape": {"seq_len": 384, "doc_stride": 128}}
    assert "reference_shape" not in ds.protocol(None, {"seq_len": 384}) and doc_stride(384) == 128


def test_an_answer_past_the_first_window_is_found(qa_folder, squad_file):
    """Logits peaking at 'its floods' (near the end of a long context) in whichever window holds it."""
    spec = get_model("bert_base")
    module = spec.build(model_dir=str(qa_folder))
    ds = open_dataset("squad", str(squad_file))
    evaluation = ds.evaluation(spec, module)
    context = PARAGRAPHS[0][0]
    first, last = context.index("its floods"), context.index("its floods") + len("its floods")
    seen = []
    for batch in ds.batches(spec, 4, {"seq_len": SEQ_LEN}, module):
        start, end = np.zeros((4, SEQ_LEN), np.float32), np.zeros((4, SEQ_LEN), np.float32)
        for row, (question, offsets) in enumerate(batch.targets):
            if question.qid != "s3":
                continue
            seen.append(int((offsets[:, 0] >= 0).nonzero()[0][0]))
            for token, (s, e) in enumerate(offsets):
                start[row, token] += 5.0 if s == first else 0.0
                end[row, token] += 5.0 if e == last else 0.0
        evaluation.add(batch, [start, end])
    assert len(seen) >= 3                                        # s3's context spans three windows or more
    assert evaluation.predictions()["s3"] == "its floods"


def test_the_n_best_only_are_candidates_and_no_candidate_answers_empty(qa_folder, squad_file):
    """The 20 highest start logits all outside the context (question and padding): the reference finds no span,
    though a search of every span would take one of the context's, and answers "empty"."""
    spec = get_model("bert_base")
    module = spec.build(model_dir=str(qa_folder))
    ds = open_dataset("squad", str(squad_file), num_samples=6)
    *_, batch = ds.batches(spec, 1, {"seq_len": SEQ_LEN}, module)       # f1's one window: a short context
    _, offsets = batch.targets[0]
    outside = (offsets[:, 0] < 0).nonzero()[0]
    start = np.linspace(0, 1, SEQ_LEN, dtype=np.float32)[None]
    start[0, outside[:20]] += 10.0
    end = np.linspace(1, 0, SEQ_LEN, dtype=np.float32)[None]
    evaluation = ds.evaluation(spec, module)
    evaluation.add(batch, [start, end])
    assert len(outside) >= 20 and evaluation.predictions() == {"f1": NO_ANSWER}
    start[0, (offsets[:, 0] >= 0).nonzero()[0][0]] += 20.0       # a context start among the 20 best
    evaluation = ds.evaluation(spec, module)
    evaluation.add(batch, [start, end])
    assert evaluation.predictions()["f1"] != NO_ANSWER


def test_loadgen_serves_windows_as_samples_and_scores_them_as_the_runner_does(qa_folder, squad_file):
    """LoadGen's accuracy mode (accuracy.SampleSource) asks for samples by index: windows, as MLPerf's BERT serves
    its features, through a fixed-shape backend; the answers score as the runner's batches do."""
    from aio_examples.backends import BACKENDS, PrepareContext
    from aio_examples.measurement import accuracy

    spec = get_model("bert_base")
    module = spec.build(model_dir=str(qa_folder))
    ds = open_dataset("squad", str(squad_file))
    shape = {"seq_len": SEQ_LEN}
    inputs = ds.example_inputs(spec, 2, shape, module)
    ctx = PrepareContext("bert_base", spec.task, "nlp", shape, 2, "w")
    prepared = BACKENDS["onnxruntime"].prepare(module, inputs, "fp32", 1, ctx)
    source = accuracy.SampleSource(ds, spec, shape, module, prepared, 2, None)
    assert len(source) == len(ds.samples) > len(ds.questions)
    answers = {}
    for first in range(0, len(source), 2):
        indices = list(range(first, min(first + 2, len(source))))
        answers.update(zip(indices, source.answers(indices), strict=True))
    served = source.score(answers)
    with torch.no_grad():
        runner = accuracy.score(ds, spec, module, BACKENDS["eager"].prepare(module, inputs, "fp32", 1, ctx), 2, shape)
    assert served["samples"] == runner.samples == len(ds.samples)
    assert served["metrics"] == pytest.approx(runner.metrics, abs=1e-6)
    assert served["protocol"]["shape"] == {"seq_len": SEQ_LEN, "doc_stride": 16}
