"""SQuAD v1.1 question answering: the official JSON file (e.g. dev-v1.1.json), scored by its EM and F1.

Scoring follows Hugging Face's question-answering evaluation (transformers' examples/pytorch/question-answering:
`prepare_validation_features` and `postprocess_qa_predictions`), the one fine-tuned SQuAD models report:

- Each question (left-stripped) and its paragraph are tokenized as one pair of `--seq-len` tokens by the model
  folder's fast tokenizer (question first, or last for a tokenizer padding on the left); a context longer than
  that is cut into overlapping windows with a document stride of `--seq-len` // 3 tokens (the reference's 128 at
  its `max_seq_length` of 384), so every part of it is read.
- In each window, the spans pairing one of the 20 highest start logits with one of the 20 highest end logits
  (n_best_size 20) that lie in the context, end no earlier than they start and are at most 30 tokens long
  (max_answer_length 30) are candidates, scored by start logit + end logit; the question's answer is the best
  candidate of all its windows (the first of equals, in window, start-rank and end-rank order), mapped back to
  the context's characters through the tokenizer's offsets. Without a candidate the answer is "empty", as the
  reference's is.

Samples are the file's questions in file order when it is opened (`--num-samples` counts them, the digest names
them); once the tokenizer is known they become the questions' windows, as the reference's (and MLPerf's BERT)
features are: a batch holds `-b` windows, and a record's `samples` counts windows. Predictions are the
`{question id: answer text}` file the official evaluate-v1.1.py rescores.
"""

from typing import NamedTuple

import numpy as np

from ..core.errors import UsageError
from . import metrics
from .base import Evaluation, LabelledDataset, read_json, tokenizer_of

FORMAT = ("a SQuAD v1.1 JSON file: {'data': [{'paragraphs': [{'context', 'qas': [{'id', 'question', "
          "'answers': [{'text', 'answer_start'}]}]}]}]}")
N_BEST = 20                     # the reference's n_best_size
MAX_ANSWER_TOKENS = 30          # its max_answer_length
REFERENCE_SHAPE = {"seq_len": 384, "doc_stride": 128}       # its max_seq_length and doc_stride
REFERENCE = ("Hugging Face question answering (transformers examples/pytorch/question-answering: "
             "prepare_validation_features, postprocess_qa_predictions with n_best_size 20, max_answer_length 30; "
             "max_seq_length 384, doc_stride 128) and SQuAD v1.1's evaluate-v1.1.py (exact match, F1)")
NO_ANSWER = "empty"             # the reference's answer when no span qualifies


def doc_stride(seq_len: int) -> int:
    """Tokens two consecutive windows of a context share: the reference's 128 of 384, in proportion."""
    return seq_len * REFERENCE_SHAPE["doc_stride"] // REFERENCE_SHAPE["seq_len"]


class Question(NamedTuple):
    qid: str
    question: str
    context: str
    answers: tuple


class Window(NamedTuple):
    """One window of a question's context, as the model reads it: its token rows (input_ids, attention_mask and,
    when the tokenizer makes them, token_type_ids) and each token's context character span, (-1, -1) outside
    the context."""

    question: Question
    encoding: dict
    offsets: np.ndarray


class Squad(LabelledDataset):
    name = "squad"
    tasks = ("question-answering",)
    path_kind = "a SQuAD v1.1 JSON file (e.g. dev-v1.1.json)"
    needs_tokenizer = True

    def __init__(self, path, labels=None, num_samples=None):
        super().__init__(path, labels, num_samples)
        self.questions = self.samples
        self._windowed = None           # (tokenizer, seq_len, windows) of the last tokenization

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

    def batches(self, spec, batch_size, shape, module):
        self.samples = self.windows(tokenizer_of(self, module), shape["seq_len"])
        return super().batches(spec, batch_size, shape, module)

    def windows(self, tokenizer, seq_len: int) -> list[Window]:
        """Every question's windows of `seq_len` tokens, in question order (the reference's features)."""
        if self._windowed is not None and self._windowed[0] is tokenizer and self._windowed[1] == seq_len:
            return self._windowed[2]
        if not getattr(tokenizer, "is_fast", False):
            raise UsageError(f"dataset {self.name!r} needs a fast tokenizer (for character offsets); accepted: "
                             "--model-dir with a folder holding tokenizer.json")
        questions = [q.question.lstrip() for q in self.questions]
        contexts = [q.context for q in self.questions]
        stride = doc_stride(seq_len)
        self._check_room(tokenizer, questions, seq_len, stride)
        question_first = tokenizer.padding_side == "right"
        enc = tokenizer(questions if question_first else contexts, contexts if question_first else questions,
                        truncation="only_second" if question_first else "only_first", max_length=seq_len,
                        stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                        padding="max_length")
        rows = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in enc]
        windows = []
        for row, index in enumerate(enc["overflow_to_sample_mapping"]):
            in_context = np.array([sid == (1 if question_first else 0) for sid in enc.sequence_ids(row)])
            offsets = np.array(enc["offset_mapping"][row], dtype=np.int32)      # int32: every window of a
            offsets[~in_context] = -1                                           # whole dev set is held
            windows.append(Window(self.questions[index], {name: np.array(enc[name][row], dtype=np.int32)
                                                          for name in rows}, offsets))
        self._windowed = (tokenizer, seq_len, windows)
        return windows

    def _check_room(self, tokenizer, questions: list[str], seq_len: int, stride: int) -> None:
        """A window must hold more context tokens than two windows share (the tokenizer would panic)."""
        lengths = [len(ids) for ids in tokenizer(questions, add_special_tokens=False)["input_ids"]]
        room = seq_len - tokenizer.num_special_tokens_to_add(pair=True)
        longest = int(np.argmax(lengths))
        if room - lengths[longest] <= stride:
            raise UsageError(f"--seq-len {seq_len} leaves {max(room - lengths[longest], 0)} context tokens beside "
                             f"squad question {self.questions[longest].qid!r}, not more than the document stride of "
                             f"{stride}; accepted: a --seq-len of at least "
                             f"{_shortest_seq_len(seq_len - room + lengths[longest])}")

    def _inputs(self, spec, shape, module, samples):
        import torch

        return module.encoded({name: torch.from_numpy(np.stack([w.encoding[name] for w in samples]).astype(np.int64))
                               for name in samples[0].encoding})

    def _target(self, sample):
        return (sample.question, sample.offsets)

    def evaluation(self, spec, module):
        return SquadEvaluation()

    def protocol(self, spec, shape):
        scored = {"seq_len": shape["seq_len"], "doc_stride": doc_stride(shape["seq_len"])}
        return {"protocol": "reference", "follows": REFERENCE, "shape": scored,
                **({"reference_shape": REFERENCE_SHAPE} if scored != REFERENCE_SHAPE else {})}


def _shortest_seq_len(fixed: int) -> int:
    """The least seq_len whose room beside `fixed` tokens (question and special tokens) exceeds its stride."""
    seq_len = fixed + 1
    while seq_len - fixed <= doc_stride(seq_len):
        seq_len += 1
    return seq_len


class Span(NamedTuple):
    score: float
    start: int                  # context characters [start, end)
    end: int


def best_span(start_logits, end_logits, offsets) -> tuple[Span | None, int]:
    """One window's best candidate span as postprocess_qa_predictions ranks them, and how many candidates it
    has: pairs of the N_BEST highest start and end logits (in argsort's order, which breaks ties as the reference
    does), both in the context, at most MAX_ANSWER_TOKENS long, end not before start; the first of equal scores
    in (start rank, end rank) order. Scores are summed in the logits' own dtype, as the reference sums them."""
    start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
    starts = np.argsort(start_logits)[-1:-N_BEST - 1:-1]
    ends = np.argsort(end_logits)[-1:-N_BEST - 1:-1]
    in_context = offsets[:, 0] >= 0
    length = ends[None, :] - starts[:, None] + 1
    valid = in_context[starts][:, None] & in_context[ends][None, :] & (length >= 1) & (length <= MAX_ANSWER_TOKENS)
    count = int(valid.sum())
    if not count:
        return None, 0
    scores = start_logits[starts][:, None] + end_logits[ends][None, :]
    first, last = np.unravel_index(np.argmax(np.where(valid, scores, -np.inf)), scores.shape)
    return Span(float(scores[first, last]), int(offsets[starts[first], 0]), int(offsets[ends[last], 1])), count


class SquadEvaluation(Evaluation):
    """Each question's best span over its windows as text, then SQuAD v1.1 exact match and F1 against its gold
    answers. Windows of a question arrive in order; each is reduced to its best candidate as it comes."""

    def __init__(self):
        self.questions, self.best, self.candidates = {}, {}, {}

    def add(self, batch, outputs):
        start_logits, end_logits = (np.asarray(o)[:batch.count] for o in outputs[:2])
        for (question, offsets), start, end in zip(batch.targets, start_logits, end_logits, strict=True):
            span, count = best_span(start, end, offsets)
            qid = question.qid
            self.questions[qid] = question
            self.candidates[qid] = self.candidates.get(qid, 0) + count
            best = self.best.get(qid)
            self.best[qid] = span if span is not None and (best is None or span.score > best.score) else best

    def metrics(self):
        return metrics.squad(self.predictions(), {qid: list(q.answers) for qid, q in self.questions.items()})

    def predictions(self):
        return {qid: self._answer(qid) for qid in self.questions}

    def _answer(self, qid) -> str:
        span = self.best[qid]
        text = self.questions[qid].context[span.start:span.end] if span else ""
        # the reference puts "empty" first when no candidate qualifies, or the only one is an empty string
        return NO_ANSWER if span is None or (self.candidates[qid] == 1 and not text) else text
