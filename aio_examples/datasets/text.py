"""Perplexity on running text: a UTF-8 text file (e.g. wikitext's test split as raw text), scored by a causal
LM's perplexity over consecutive windows of its tokens.

The whole file is tokenized once by the model folder's tokenizer (no special tokens added) and cut into
consecutive windows of `--seq-len` + `--new-tokens` tokens; a last partial window is dropped, and
`--num-samples N` scores the first N windows. A backend prepared the generation step for two shapes only, a
prefill of `--seq-len` tokens and decode steps of one token over a static cache of the window's length, so a
window is run with exactly those (nothing recompiles): its first `--seq-len` tokens are prefilled into a new
cache, then each true next token is fed as a decode step (teacher forcing). The prefill's logits predict token
`seq_len` and each decode step's the token after the one it was fed, so every window scores its last
`--new-tokens` tokens, each conditioned on all of the window before it. Metrics (both lower is better): `nll`,
the mean negative log-likelihood of the scored tokens in nats, and `perplexity`, exp of it. Predictions list
each window's scored token ids and their NLLs.
"""

import hashlib
import math

import numpy as np

from ..core.errors import UsageError
from .base import Evaluation, LabelledDataset, read_text, tokenizer_of

FORMAT = "a UTF-8 text file of running text (e.g. wikitext's test split as raw text)"


class Text(LabelledDataset):
    name = "text"
    tasks = ("text-generation",)
    path_kind = FORMAT
    needs_tokenizer = True

    def __init__(self, path: str, labels: str | None = None, num_samples: int | None = None):
        self.windows_max = num_samples    # the samples are windows of tokens, known once the tokenizer is
        self._tokens = None               # (tokenizer, the file's token ids): the file is tokenized once
        super().__init__(path, labels, num_samples)

    def _index(self):
        if not self.path.is_file():
            raise UsageError(f"text dataset {str(self.path)!r} is not a file; accepted: {FORMAT}")
        if self.labels:
            raise UsageError(f"text dataset takes no --labels ({str(self.labels)!r}); accepted: {FORMAT}")
        self.text = read_text(self.path, FORMAT)
        if not self.text.strip():
            raise UsageError(f"text dataset {str(self.path)!r} holds no text; accepted: {FORMAT}")
        return [self.text]      # one document until the tokenizer cuts it into windows (`batches`)

    def _describe_sample(self, sample):
        return hashlib.sha256(sample.encode()).hexdigest()

    def batches(self, spec, batch_size, shape, module):
        self.shape = dict(shape)
        self.samples = self._windows(module)      # each window's first token, in the file's tokens
        return super().batches(spec, batch_size, shape, module)

    def _windows(self, module) -> list[int]:
        tokenizer = tokenizer_of(self, module)
        if self._tokens is None or self._tokens[0] is not tokenizer:
            ids = tokenizer(self.text, add_special_tokens=False, verbose=False)["input_ids"]
            self._tokens = tokenizer, np.asarray(ids, dtype=np.int64)
        tokens, length = len(self._tokens[1]), self.shape["seq_len"] + self.shape["new_tokens"]
        if tokens < length:
            raise UsageError(f"text dataset {str(self.path)!r} is {tokens} tokens long, less than one window of "
                             f"--seq-len + --new-tokens = {length}; accepted: {FORMAT} at least that long")
        return list(range(0, tokens - length + 1, length))[:self.windows_max]

    def _inputs(self, spec, shape, module, samples):
        import torch

        length = shape["seq_len"] + shape["new_tokens"]
        return (torch.from_numpy(np.stack([self._tokens[1][start:start + length] for start in samples])),)

    def _target(self, sample):
        first = sample + self.shape["seq_len"]
        return (sample, self._tokens[1][first:first + self.shape["new_tokens"]].tolist())

    def example_inputs(self, spec, batch_size, shape, module):
        """The first windows' prompts (their first `--seq-len` tokens): the prefill the backends prepare."""
        return prompts(super().example_inputs(spec, batch_size, shape, module), shape["seq_len"])

    def calibration_inputs(self, spec, batch_size, shape, module, n):
        return [prompts(inputs, shape["seq_len"]) for inputs in super().calibration_inputs(spec, batch_size, shape,
                                                                                           module, n)]

    def drive(self, step, inputs):
        """A batch of windows through the prepared step, teacher-forced: the NLL of each of its scored tokens."""
        import torch

        windows, seq_len = inputs[0], self.shape["seq_len"]
        with torch.no_grad():
            steps = Steps(step, windows[:, :seq_len], windows.shape[1])
            nll = [token_nll(steps.logits, windows[:, seq_len])]
            for position in range(seq_len, windows.shape[1] - 1):
                nll.append(token_nll(steps.feed(windows[:, position]), windows[:, position + 1]))
        return [torch.stack(nll, 1).numpy()]

    def evaluation(self, spec, module):
        return Perplexity()


def prompts(inputs: tuple, seq_len: int) -> tuple:
    """A batch's first `seq_len` tokens, contiguous as the generation step is always given them."""
    import torch

    return (inputs[0][:, :seq_len].clone(memory_format=torch.contiguous_format),)


def token_nll(logits, tokens):
    """-log p(token) under each row's next-token logits (batch, vocab), in float64."""
    import torch

    log_probs = torch.log_softmax(logits.detach().float(), dim=-1)
    return -log_probs.gather(1, tokens.long()[:, None])[:, 0].double()


class Steps:
    """One batch through a prepared generation step with only the two shapes the backend prepared: a prefill
    of the prompt over a new static cache of `cache_len` tokens, then one token per step at the next position
    (the inputs built as `GreedyGeneration` builds them, so no guard of a compiled step fails). `logits` are
    the last step's, predicting the next token (batch, vocab)."""

    def __init__(self, step, prompt, cache_len: int):
        import torch

        self.step, self.cache, self.position = step, step.new_cache(cache_len), prompt.shape[1]
        # a step may run its prefill its own way (eager beside a compiled decode step: backends/generation.py)
        self.logits = getattr(step, "prefill", step)(prompt.clone(memory_format=torch.contiguous_format),
                                                     self.cache, torch.arange(self.position))

    def feed(self, tokens):
        """Each row's next token (batch,) as one decode step; the logits that follow it."""
        import torch

        ids = tokens[:, None].clone(memory_format=torch.contiguous_format)
        self.logits = self.step(ids, self.cache, torch.tensor([self.position]))
        self.position += 1
        return self.logits


class Perplexity(Evaluation):
    """exp(mean NLL) over every scored token of every window (a token-weighted mean, as the field reports it)."""

    def __init__(self):
        self.windows = []

    def add(self, batch, outputs):
        nll = np.asarray(outputs[0], dtype=np.float64)[:batch.count]
        for (start, tokens), row in zip(batch.targets, nll, strict=True):
            self.windows.append((start, tokens, row))

    def metrics(self):
        mean = float(np.mean(np.concatenate([row for _, _, row in self.windows])))
        return {"perplexity": math.exp(mean), "nll": mean}

    def predictions(self):
        return [{"window": number, "first_token": start, "tokens": tokens, "nll": [round(float(x), 6) for x in row]}
                for number, (start, tokens, row) in enumerate(self.windows)]
