"""LAMBADA last-word prediction: a causal LM reads a passage without its last word and must generate that word.

The file is either JSON lines of `{"text": PASSAGE}` (EleutherAI's lambada_openai jsonl) or plain UTF-8 text,
one passage per non-empty line. A passage's target is its last word (after its last space) and its context
everything before. The context is tokenized (no special tokens added) and its last `--seq-len` tokens are the
prefill. The prepared step was compiled for exactly that length and takes no attention mask, so short contexts
are not padded: a passage whose context has fewer than `--seq-len` tokens is skipped, and so is one whose target
(" " + the word, tokenized) has more than `--new-tokens` tokens, which could not be generated whole. The record's
`accuracy.dataset.skipped` counts them and the predictions file lists them with the reason: pick a `--seq-len`
below most contexts' length (LAMBADA's run from about 40 to 200 tokens). The model then decodes greedily, one
fixed-shape step per token, as many tokens as the batch's longest target. A passage is correct when the first
tokens of the greedy continuation are its target's tokens: the standard LAMBADA last-word accuracy. Metric:
`accuracy`. Predictions: each passage's line, target, the predicted text (those first tokens decoded), and
whether it was right.
"""

import json
from typing import NamedTuple

import numpy as np

from ..core.errors import UsageError
from .base import Batch, Evaluation, LabelledDataset, read_text, tokenizer_of
from .text import Steps

FORMAT = ("a LAMBADA file: JSON lines of {\"text\": PASSAGE} (lambada_openai's jsonl) or plain UTF-8 text, one "
          "passage per line, its last word the target")


class Passage(NamedTuple):
    line: int
    context: str
    target: str


class Lambada(LabelledDataset):
    name = "lambada"
    tasks = ("text-generation",)
    path_kind = FORMAT
    needs_tokenizer = True

    def __init__(self, path: str, labels: str | None = None, num_samples: int | None = None):
        self._encoded = None         # (tokenizer, (seq_len, new_tokens), the passages kept): tokenized once
        self.skipped: list[dict] = []
        super().__init__(path, labels, num_samples)

    def _index(self):
        if not self.path.is_file():
            raise UsageError(f"lambada dataset {str(self.path)!r} is not a file; accepted: {FORMAT}")
        if self.labels:
            raise UsageError(f"lambada dataset takes no --labels ({str(self.labels)!r}); accepted: {FORMAT}")
        lines = [(number, line.strip()) for number, line in enumerate(read_text(self.path, FORMAT).split("\n"), 1)
                 if line.strip()]
        json_lines = bool(lines) and lines[0][1].startswith("{")
        samples = []
        for number, line in lines:
            passage = self._passage(number, line) if json_lines else line
            context, _, target = passage.rpartition(" ")
            if not context.strip() or not target:
                raise UsageError(f"{str(self.path)!r} line {number} has no context before its last word "
                                 f"({passage[:60]!r}); accepted: {FORMAT}")
            samples.append(Passage(number, context.rstrip(), target))
        return samples

    def _passage(self, number: int, line: str) -> str:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            raise UsageError(f"{str(self.path)!r} line {number} is not JSON ({line[:60]!r}); accepted: {FORMAT}, "
                             "the same form on every line") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("text"), str):
            raise UsageError(f"{str(self.path)!r} line {number} is not an object with a \"text\" string "
                             f"({line[:60]!r}); accepted: {FORMAT}")
        return entry["text"].strip()

    def _describe_sample(self, sample):
        return list(sample)

    def describe(self):
        return {**super().describe(), "skipped": len(self.skipped)}

    def batches(self, spec, batch_size, shape, module):
        import torch

        self.shape = dict(shape)
        kept = self._kept(module)
        for start in range(0, len(kept), batch_size):
            chunk = kept[start:start + batch_size]
            padded = chunk + [chunk[-1]] * (batch_size - len(chunk))
            self._decode = max(len(target) for _, _, target in padded)       # tokens `drive` generates
            yield Batch((torch.tensor([context for _, context, _ in padded]),),
                        [(p.line, p.target, target) for p, _, target in chunk])

    def _kept(self, module) -> list[tuple]:
        """(passage, its last `--seq-len` context tokens, its target's tokens) of every passage that fits the
        shape; the others in `skipped`, with the reason."""
        tokenizer, seq_len, new_tokens = tokenizer_of(self, module), self.shape["seq_len"], self.shape["new_tokens"]
        if self._encoded is not None and self._encoded[0] is tokenizer and self._encoded[1] == (seq_len, new_tokens):
            return self._encoded[2]
        contexts = tokenizer([p.context for p in self.samples], add_special_tokens=False, verbose=False)["input_ids"]
        targets = tokenizer([" " + p.target for p in self.samples], add_special_tokens=False)["input_ids"]
        kept, self.skipped = [], []
        for passage, context, target in zip(self.samples, contexts, targets, strict=True):
            reason = (f"context of {len(context)} tokens, fewer than --seq-len {seq_len}" if len(context) < seq_len
                      else f"target of {len(target)} tokens, more than --new-tokens {new_tokens}"
                      if len(target) > new_tokens else "target of no token" if not target else None)
            if reason:
                self.skipped.append({"line": passage.line, "target": passage.target, "skipped": reason})
            else:
                kept.append((passage, context[-seq_len:], target))
        if not kept:
            raise UsageError(f"lambada dataset {str(self.path)!r}: none of its {len(self.samples)} passages has a "
                             f"context of at least --seq-len {seq_len} tokens and a target of at most --new-tokens "
                             f"{new_tokens}; accepted: a shorter --seq-len")
        self._encoded = tokenizer, (seq_len, new_tokens), kept
        return kept

    def drive(self, step, inputs):
        """A batch of contexts through the prepared step: prefill, then greedy decoding of the batch's longest
        target's token count, every step at the shapes the backend prepared."""
        import torch

        contexts = inputs[0]
        with torch.no_grad():
            steps = Steps(step, contexts, contexts.shape[1] + self.shape["new_tokens"])
            tokens = [steps.logits.argmax(-1)]
            for _ in range(self._decode - 1):
                tokens.append(steps.feed(tokens[-1]).argmax(-1))
        return [torch.stack(tokens, 1).numpy()]

    def evaluation(self, spec, module):
        return LastWord(tokenizer_of(self, module), self)


class LastWord(Evaluation):
    """Right when the greedy continuation starts with the target's tokens; predictions in the file's order,
    the skipped passages among them."""

    def __init__(self, tokenizer, dataset: Lambada):
        self.tokenizer, self.dataset = tokenizer, dataset
        self.passages = []

    def add(self, batch, outputs):
        generated = np.asarray(outputs[0])[:batch.count]
        for (line, target, target_ids), row in zip(batch.targets, generated, strict=True):
            predicted = [int(t) for t in row[:len(target_ids)]]
            self.passages.append({"line": line, "target": target, "predicted": self.tokenizer.decode(predicted).strip(),
                                  "correct": predicted == list(target_ids)})

    def metrics(self):
        return {"accuracy": sum(p["correct"] for p in self.passages) / len(self.passages)}

    def predictions(self):
        return sorted(self.passages + self.dataset.skipped, key=lambda p: p["line"])
