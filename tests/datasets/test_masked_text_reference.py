"""Masked-text accuracy as the fill-mask pipeline ranks tokens: the harness's top-1 and top-5 against transformers'
`pipeline("fill-mask")` run here on each masked sentence and against scikit-learn's top-k accuracy, on a tiny BERT
(tiny_folders.py) whose predictions depend on the sentence."""

import numpy as np
import pytest
import torch
from sklearn.metrics import top_k_accuracy_score

from aio_examples.datasets import open_dataset
from aio_examples.models import get_model
from aio_examples.models.nlp import load_transformers

pytest_plugins = ["tiny_folders"]          # the tiny model folders' fixtures

SENTENCES = ["the cat sat on the mat", "a dog ran in the park today", "the film was long and dull",
             "she read the book in one night", "rain fell on the old town", "the team won the final game",
             "he never liked the cold wind", "birds sang before the dawn"]


def test_top_1_and_top_5_are_the_fill_mask_pipelines(tiny_bert, tmp_path):
    words = sorted({w for s in SENTENCES for w in s.split()})
    folder = tiny_bert(words, "BertForMaskedLM", initializer_range=1.0)
    path = tmp_path / "sentences.txt"
    path.write_text("\n".join(SENTENCES) + "\n")
    spec = get_model("roberta_base")
    module = spec.build(model_dir=str(folder))
    ds = open_dataset("masked-text", str(path))
    evaluation, rows, expected = ds.evaluation(spec, module), [], []
    for batch in ds.batches(spec, 3, {"seq_len": 16}, module):
        with torch.no_grad():
            logits = module(*batch.inputs)[0].numpy()
        evaluation.add(batch, [logits])
        rows += [logits[i, position] for i, (_, position, _, _) in enumerate(batch.targets)]
        expected += [token for _, _, token, _ in batch.targets]

    fill = load_transformers().pipeline("fill-mask", model=str(folder), top_k=5)
    tokenizer = module.tokenizer
    answers = [fill(p["masked"].replace("[MASK]", tokenizer.mask_token)) for p in evaluation.predictions()]
    top5 = [[a["token"] for a in answer] for answer in answers]
    assert len({tuple(t) for t in top5}) > 1                       # the ranking depends on the sentence
    hits1 = np.mean([t[0] == e for t, e in zip(top5, expected, strict=True)])
    hits5 = np.mean([e in t for t, e in zip(top5, expected, strict=True)])
    assert np.concatenate(evaluation.top5).tolist() == top5       # the same five tokens, in the same order
    assert evaluation.metrics() == {"top_1": pytest.approx(hits1), "top_5": pytest.approx(hits5)}
    assert [p["predicted"] for p in evaluation.predictions()] == [a[0]["token_str"].strip() for a in answers]
    classes = np.arange(len(rows[0]))
    assert evaluation.metrics()["top_5"] == pytest.approx(top_k_accuracy_score(expected, rows, k=5, labels=classes))
    assert ds.protocol(spec, {"seq_len": 16})["shape"] == {"seq_len": 16}
