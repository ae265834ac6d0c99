"""Masked-token prediction on plain text: one sentence per line, scored by masked-token top-1 and top-5 accuracy,
the tokens at the mask ranked by their logits as transformers' fill-mask pipeline ranks them.

The file is UTF-8 text; each non-empty line is one sample. It is tokenized to `--seq-len` tokens (longer
lines truncated) and one token is masked deterministically, with no randomness: the middle one of its
non-special tokens (index n // 2 of the n word pieces that fit), replaced by the tokenizer's mask token. The
target is that token's id. Predictions list each sample's line number, the sentence as the model saw it
(decoded, mask included), and the expected and predicted tokens (decoded word pieces).
"""

import numpy as np

from ..core.errors import UsageError
from . import base, metrics
from .base import Evaluation, LabelledDataset, read_text

FORMAT = "a UTF-8 text file, one sentence per non-empty line"


class MaskedText(LabelledDataset):
    name = "masked-text"
    tasks = ("fill-mask",)
    path_kind = FORMAT
    needs_tokenizer = True

    def _index(self):
        if not self.path.is_file():
            raise UsageError(f"masked-text dataset {str(self.path)!r} is not a file; accepted: {FORMAT}")
        if self.labels:
            raise UsageError(f"masked-text dataset takes no --labels ({str(self.labels)!r}); accepted: {FORMAT}")
        text = read_text(self.path, FORMAT)
        return [(number, line.strip()) for number, line in enumerate(text.split("\n"), 1) if line.strip()]

    def _describe_sample(self, sample):
        return list(sample)

    def _inputs(self, spec, shape, module, samples):
        tokenizer = mask_tokenizer(self, module)
        enc = tokenizer([text for _, text in samples], truncation=True, padding="max_length",
                        max_length=shape["seq_len"], return_special_tokens_mask=True, return_tensors="pt")
        ids = enc["input_ids"]
        maskable = (enc["special_tokens_mask"] == 0) & (enc["attention_mask"] == 1)
        self._masks = {}
        for row, (number, _) in enumerate(samples):
            positions = maskable[row].nonzero().flatten().tolist()
            if not positions:
                raise UsageError(f"{str(self.path)!r} line {number} has no token to mask within --seq-len "
                                 f"{shape['seq_len']}; accepted: {FORMAT}, and a longer --seq-len")
            position = positions[len(positions) // 2]
            expected = int(ids[row, position])
            ids[row, position] = tokenizer.mask_token_id
            seen = ids[row][maskable[row]]           # the sentence's tokens, the mask among them
            self._masks[number] = (position, expected, tokenizer.decode(seen.tolist()))
        return ids, enc["attention_mask"]

    def _target(self, sample):
        return (sample[0], *self._masks[sample[0]])

    def evaluation(self, spec, module):
        return MaskedTopK(mask_tokenizer(self, module))

    def protocol(self, spec, shape):
        return {"protocol": "reference", "follows": "fill-mask top-1 and top-5 accuracy: the tokens ranked at the mask "
                "as transformers' fill-mask pipeline ranks them (its top_k 5); one mask a line, at its middle word "
                "piece (this dataset's deterministic choice)", "shape": {"seq_len": shape["seq_len"]}}


def mask_tokenizer(dataset, module):
    """The model folder's tokenizer, which must have a mask token."""
    tokenizer = base.tokenizer_of(dataset, module)
    if tokenizer.mask_token_id is None:
        raise UsageError(f"dataset {dataset.name!r} needs a tokenizer with a mask token; accepted: --model-dir "
                         "with a masked language model's folder")
    return tokenizer


class MaskedTopK(Evaluation):
    """Top-1/top-5 of the logits at each sample's masked position against the token that was there."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.top5, self.expected, self.samples = [], [], []

    def add(self, batch, outputs):
        logits = np.asarray(outputs[0])[:batch.count]
        positions = [position for _, position, _, _ in batch.targets]
        self.top5.append(metrics.ranked(logits[np.arange(batch.count), positions], 5))
        self.expected += [expected for _, _, expected, _ in batch.targets]
        self.samples += [(number, masked) for number, _, _, masked in batch.targets]

    def metrics(self):
        return metrics.top_k(np.concatenate(self.top5), self.expected)

    def predictions(self):
        best = np.concatenate(self.top5)[:, 0]
        return [{"line": number, "masked": masked, "expected": self._token(expected), "predicted": self._token(p)}
                for (number, masked), expected, p in zip(self.samples, self.expected, best, strict=True)]

    def _token(self, token_id) -> str:
        return self.tokenizer.decode([int(token_id)]).strip()
