"""GLUE scored as `evaluate`'s glue metric scores each task: the harness's predictions and metrics against the
model run here as transformers' run_glue.py runs it and scikit-learn's and scipy's metrics computed here, on tiny
BERT classifiers (tiny_folders.py) whose predictions depend on the text."""

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from aio_examples.core.errors import UsageError
from aio_examples.datasets import open_dataset
from aio_examples.models import get_model
from aio_examples.models.nlp import load_transformers

pytest_plugins = ["tiny_folders"]          # the tiny model folders' fixtures

SEQ_LEN = 24
SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "the film was long and dull",
             "she read the book in one night", "rain fell on the old town", "the team won the final game",
             "he never liked the cold", "birds sang before the dawn", "the soup was too salty",
             "they built a house by the lake", "music filled the empty hall", "the train left on time"]
WORDS = sorted({w for s in SENTENCES for w in s.split()})
PAIRS = [(SENTENCES[i], SENTENCES[(3 * i + 1) % len(SENTENCES)]) for i in range(len(SENTENCES))]


def write(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def classifiers(tiny_bert):
    """Weights large enough (initializer_range 1) that the predicted class and score change with the text."""
    return {labels: tiny_bert(WORDS, "BertForSequenceClassification", num_labels=labels, initializer_range=1.0)
            for labels in (1, 2)}


def harness(path, folder):
    spec = get_model("distilbert_base")
    module = spec.build(model_dir=str(folder))
    ds = open_dataset("glue", str(path))
    evaluation = ds.evaluation(spec, module)
    for batch in ds.batches(spec, 5, {"seq_len": SEQ_LEN}, module):
        with torch.no_grad():
            evaluation.add(batch, [t.numpy() for t in module(*batch.inputs)])
    return ds, evaluation


def reference_predictions(folder, texts, regression):
    """run_glue.py: the texts (a pair together) padded and truncated to max_seq_length, the argmax of the logits,
    or the squeezed logits of a regression."""
    tf = load_transformers()
    tokenizer = tf.AutoTokenizer.from_pretrained(folder)
    model = tf.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    args = list(zip(*texts, strict=True))
    enc = tokenizer(*args, padding="max_length", max_length=SEQ_LEN, truncation=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits.numpy()
    return np.squeeze(logits) if regression else np.argmax(logits, axis=1)


def labels_from(predictions, flip):
    """Labels that agree with the predictions except at `flip` (so every metric is away from its bounds)."""
    return [int(p) ^ (i in flip) for i, p in enumerate(predictions)]


@pytest.mark.parametrize("where", ["CoLA/dev.tsv", "cola_dev.tsv"])
def test_cola_is_scored_by_matthews_correlation(classifiers, tmp_path, where):
    texts = [(s,) for s in SENTENCES]
    expected = reference_predictions(classifiers[2], texts, regression=False)
    assert 0 < expected.sum() < len(expected)                        # both classes predicted
    labels = labels_from(expected, flip={1, 4, 7})
    path = write(tmp_path / where, ["sentence", "label"], [(s, y) for s, y in zip(SENTENCES, labels, strict=True)])
    ds, evaluation = harness(path, classifiers[2])
    assert [p["predicted"] for p in evaluation.predictions()] == expected.tolist()
    assert evaluation.metrics() == {"matthews_correlation": pytest.approx(matthews_corrcoef(labels, expected))}
    assert ds.protocol(None, {"seq_len": SEQ_LEN})["follows"].startswith("GLUE cola")


@pytest.mark.parametrize("task", ["MRPC", "QQP"])
def test_mrpc_and_qqp_are_scored_by_accuracy_and_f1(classifiers, tmp_path, task):
    texts = PAIRS
    expected = reference_predictions(classifiers[2], texts, regression=False)
    assert 0 < expected.sum() < len(expected)
    labels = labels_from(expected, flip={0, 5})
    columns = ["question1", "question2"] if task == "QQP" else ["sentence1", "sentence2"]
    path = write(tmp_path / task / "dev.tsv", [*columns, "label"], [(*t, y) for t, y in zip(texts, labels, strict=True)])
    _, evaluation = harness(path, classifiers[2])
    assert [p["predicted"] for p in evaluation.predictions()] == expected.tolist()
    assert evaluation.metrics() == {"accuracy": pytest.approx(accuracy_score(labels, expected)),
                                    "f1": pytest.approx(f1_score(labels, expected))}


def test_stsb_is_scored_by_pearson_and_spearman_of_the_single_output(classifiers, tmp_path):
    texts = PAIRS
    expected = reference_predictions(classifiers[1], texts, regression=True)
    scores = [round(float(v) * 2 + (i % 3) * 0.7, 3) for i, v in enumerate(expected)]     # correlated, not fully
    path = write(tmp_path / "STS-B" / "dev.tsv", ["sentence1", "sentence2", "label"],
                 [(*t, y) for t, y in zip(texts, scores, strict=True)])
    ds, evaluation = harness(path, classifiers[1])
    assert [p["predicted"] for p in evaluation.predictions()] == pytest.approx(expected.tolist(), abs=1e-5)
    assert evaluation.metrics() == {"pearson": pytest.approx(pearsonr(expected, scores)[0], abs=1e-6),
                                    "spearmanr": pytest.approx(spearmanr(expected, scores)[0], abs=1e-6)}
    assert "Pearson and Spearman" in ds.protocol(None, {"seq_len": SEQ_LEN})["follows"]
    with pytest.raises(UsageError, match=r"^GLUE stsb is scored on a regression's single output, and the model "
                                         r"has 2; accepted: an STS-B model \(num_labels 1\)$"):
        harness(path, classifiers[2])


def test_other_tasks_and_unnamed_files_are_scored_by_accuracy(classifiers, tmp_path):
    texts = [(s,) for s in SENTENCES]
    expected = reference_predictions(classifiers[2], texts, regression=False)
    labels = labels_from(expected, flip={2})
    rows = [(s, y) for s, y in zip(SENTENCES, labels, strict=True)]
    for where, protocol in [("SST-2/dev.tsv", True), ("sentences.tsv", False)]:
        ds, evaluation = harness(write(tmp_path / where, ["sentence", "label"], rows), classifiers[2])
        assert evaluation.metrics() == {"accuracy": pytest.approx(accuracy_score(labels, expected))}
        assert (ds.protocol(None, {"seq_len": SEQ_LEN}) is not None) == protocol


def test_a_score_is_a_label_of_stsb_only(tmp_path):
    rows = [("a", "b", "3.8")]
    assert open_dataset("glue", str(write(tmp_path / "stsb.tsv", ["sentence1", "sentence2", "label"], rows))).samples
    with pytest.raises(UsageError, match=r"line 2: label '3\.8' is not a class number; accepted"):
        open_dataset("glue", str(write(tmp_path / "mrpc.tsv", ["sentence1", "sentence2", "label"], rows)))
    with pytest.raises(UsageError, match=r"line 2: label 'high' is not a score; accepted"):
        open_dataset("glue", str(write(tmp_path / "STS-B" / "dev.tsv", ["sentence1", "sentence2", "label"],
                                       [("a", "b", "high")])))
