"""SQuAD v1.1 question answering: the official JSON file (e.g. dev-v1.1.json), scored by its EM and F1.

Samples are the file's questions in file order. Each is tokenized with its paragraph as one (question,
context) pair of `--seq-len` tokens by the model folder's fast tokenizer; a context longer than that is
truncated (there is no document stride), so an answer past the cut cannot be found and scores zero. The
answer is the best-scoring span (start logit + end logit) of at most 30 tokens that starts no later than it
ends and lies inside the context, mapped back to the context's characters through the tokenizer's offsets.
Predictions are the `{question id: answer text}` file the official evaluate-v1.1.py rescores.
"""

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ..core.errors import UsageError
from . import metrics
from .base import Evaluation, LabelledDataset, read_json, tokenizer_of

FORMAT = ("a SQuAD v1.1 JSON file: {'data': [{'paragraphs': [{'context', 'qas': [{'id', 'question', "
          "'answers': [{'text', 'answer_start'}]}]}]}]}")
MAX_ANSWER_TOKENS = 30


class Question(NamedTuple):
    qid: str
    question: str
    context: str
    answers: tuple


class Squad(LabelledDataset):
    name = "squad"
    tasks = ("question-answering",)
    path_kind = "a SQuAD v1.1 JSON file (e.g. dev-v1.1.json)"
    needs_tokenizer = True

    def _index(self):
        if not self.path.is_file():
            raise UsageError(f"squad dataset {str(self.path)!r} is not a file; accepted: {FORMAT}")
        if self.labels:
            raise UsageError(f"squad dataset takes no --labels ({str(self.labels)!r}); accepted: {FORMAT}")
        data = read_json(self.path, FORMAT)
        articles = data.get("data") if isinstance(data, dict) else None
        if not isinstance(articles, list):
            raise UsageError(f"{str(self.path)!r} is not a SQuAD file (no 'data' list); accepted: {FORMAT}")
        samples = []
        try:
            for article in articles:
                for paragraph in article["paragraphs"]:
                    context = paragraph["context"]
                    for qa in paragraph["qas"]:
                        answers = tuple(a["text"] for a in qa["answers"])
                        if not answers:
                            raise UsageError(f"{str(self.path)!r}: question {qa['id']!r} has no answer (a SQuAD "
                                             f"v2.0 file?); accepted: {FORMAT}, every question answered")
                        samples.append(Question(str(qa["id"]), qa["question"], context, answers))
        except (KeyError, TypeError) as exc:
            what = f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else "an entry of the wrong type"
            raise UsageError(f"{str(self.path)!r} is not a SQuAD file ({what} at question {len(samples) + 1}); "
                             f"accepted: {FORMAT}") from None
        if not all(isinstance(t, str) for s in samples for t in (s.question, s.context, *s.answers)):
            raise UsageError(f"{str(self.path)!r} has a question, context or answer that is not text; "
                             f"accepted: {FORMAT}")
        seen = set()
        for sample in samples:
            if sample.qid in seen:
                raise UsageError(f"{str(self.path)!r} has question id {sample.qid!r} twice; accepted: {FORMAT}, "
                                 "each id once")
            seen.add(sample.qid)
        return samples

    def _describe_sample(self, sample):
        return [sample.qid, sample.question, list(sample.answers)]

    def _inputs(self, spec, shape, module, samples):
        tokenizer = tokenizer_of(self, module)
        if not getattr(tokenizer, "is_fast", False):
            raise UsageError(f"dataset {self.name!r} needs a fast tokenizer (for character offsets); accepted: "
                             "--model-dir with a folder holding tokenizer.json")
        seq_len = shape["seq_len"]
        try:
            enc = tokenizer([s.question.lstrip() for s in samples], [s.context for s in samples],
                            truncation="only_second", padding="max_length", max_length=seq_len,
                            return_offsets_mapping=True, return_tensors="pt")
        except Exception:  # noqa: BLE001  (tokenizers raises a bare Exception when a question fills --seq-len)
            longest = max(samples, key=lambda s: len(tokenizer(s.question)["input_ids"]))
            raise UsageError(f"--seq-len {seq_len} leaves no room for the context of squad question "
                             f"{longest.qid!r}; accepted: a --seq-len longer than its question") from None
        # Each sample's token -> context character span; (-1, -1) for tokens outside the context.
        self._offsets = {}
        for row, sample in enumerate(samples):
            in_context = np.array([sid == 1 for sid in enc.sequence_ids(row)])
            offsets = enc["offset_mapping"][row].numpy().astype(np.int64)
            offsets[~in_context] = -1
            self._offsets[sample.qid] = offsets
        return module.encoded(enc)

    def _target(self, sample):
        return (sample.qid, sample.context, self._offsets[sample.qid], sample.answers)

    def evaluation(self, spec, module):
        return SquadEvaluation()


@lru_cache(maxsize=4)
def _short_spans(length: int) -> np.ndarray:
    """(start, end) token pairs with start <= end < start + MAX_ANSWER_TOKENS."""
    upper = np.triu(np.ones((length, length), dtype=bool))
    return upper & ~np.triu(upper, MAX_ANSWER_TOKENS)


def best_span(start_logits, end_logits, offsets) -> tuple[int, int] | None:
    """The (start, end) token pair of the highest start + end logit among the spans of at most
    MAX_ANSWER_TOKENS context tokens with start <= end; None when no token is in the context."""
    length = len(start_logits)
    in_context = offsets[:, 0] >= 0
    allowed = _short_spans(length) & in_context[:, None] & in_context[None, :]
    if not allowed.any():
        return None
    scores = np.where(allowed, np.add.outer(np.asarray(start_logits, np.float64), np.asarray(end_logits, np.float64)),
                      -np.inf)
    return divmod(int(np.argmax(scores)), length)


class SquadEvaluation(Evaluation):
    """Each question's best span as text, then SQuAD v1.1 exact match and F1 against its gold answers."""

    def __init__(self):
        self.predicted, self.answers = {}, {}

    def add(self, batch, outputs):
        start_logits, end_logits = (np.asarray(o)[:batch.count] for o in outputs[:2])
        for (qid, context, offsets, answers), start, end in zip(batch.targets, start_logits, end_logits, strict=True):
            span = best_span(start, end, offsets)
            self.predicted[qid] = context[offsets[span[0], 0]:offsets[span[1], 1]] if span else ""
            self.answers[qid] = list(answers)

    def metrics(self):
        return metrics.squad(self.predicted, self.answers)

    def predictions(self):
        return dict(self.predicted)
