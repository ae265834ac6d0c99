"""GLUE-style text classification: a tab-separated file with a header row, scored by accuracy.

The file is one of GLUE's dev.tsv files (or any file laid out like them): a `label` column holding each row's
class as a whole number (the index of the model head's output) and the text columns GLUE uses, looked for
in this order: sentence1 + sentence2 (MRPC, RTE, WNLI, STS-B), question1 + question2 (QQP), question +
sentence (QNLI), premise + hypothesis, sentence (SST-2, CoLA's headed form). Other columns are ignored.
Fields are read unquoted (`csv.QUOTE_NONE`), as GLUE's files need. A row's prediction is the argmax of
the logits; predictions list each row's `index` (0-based among the file's rows), label and predicted class.
"""

import csv
import io

import numpy as np

from ..core.errors import UsageError
from . import metrics
from .base import Evaluation, LabelledDataset, read_text, tokenizer_of

TEXT_COLUMNS = (("sentence1", "sentence2"), ("question1", "question2"), ("question", "sentence"),
                ("premise", "hypothesis"), ("sentence",))
FORMAT = ("a tab-separated file with a header row naming a 'label' column (a whole number class) and the "
          "text columns " + ", ".join("+".join(c) for c in TEXT_COLUMNS))


class Glue(LabelledDataset):
    name = "glue"
    tasks = ("text-classification",)
    path_kind = "a GLUE-style TSV file (e.g. SST-2's dev.tsv)"
    needs_tokenizer = True

    def _index(self):
        if not self.path.is_file():
            raise UsageError(f"glue dataset {str(self.path)!r} is not a file; accepted: {FORMAT}")
        if self.labels:
            raise UsageError(f"glue dataset takes no --labels ({str(self.labels)!r}); accepted: {FORMAT}")
        rows = csv.reader(io.StringIO(read_text(self.path, FORMAT)), delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(rows, None)
        if not header or not any(field.strip() for field in header):
            raise UsageError(f"{str(self.path)!r} is empty (line 1 has no header); accepted: {FORMAT}")
        header = [field.strip() for field in header]
        texts = next((c for c in TEXT_COLUMNS if all(name in header for name in c)), None)
        if "label" not in header or texts is None:
            missing = "'label' column" if "label" not in header else "text columns"
            raise UsageError(f"{str(self.path)!r} line 1 has no {missing} (header: {' '.join(header)[:120]!r}); "
                             f"accepted: {FORMAT}")
        label, text = header.index("label"), [header.index(name) for name in texts]
        samples = []
        for row in rows:
            if not any(field.strip() for field in row):
                continue
            if len(row) <= max(label, *text):
                raise UsageError(f"{str(self.path)!r} line {rows.line_num} has {len(row)} of the header's "
                                 f"{len(header)} fields; accepted: {FORMAT}")
            if not row[label].strip().isdecimal():
                raise UsageError(f"{str(self.path)!r} line {rows.line_num}: label {row[label][:40]!r} is not a "
                                 f"class number; accepted: {FORMAT}")
            samples.append((len(samples), rows.line_num, tuple(row[i] for i in text), int(row[label])))
        return samples

    def _describe_sample(self, sample):
        _, line, texts, label = sample
        return [line, list(texts), label]

    def _inputs(self, spec, shape, module, samples):
        tokenizer = tokenizer_of(self, module)
        texts = [s[2] for s in samples]
        pairs = [t[1] for t in texts] if len(texts[0]) == 2 else None
        enc = tokenizer([t[0] for t in texts], pairs, truncation=True, padding="max_length",
                        max_length=shape["seq_len"], return_tensors="pt")
        return module.encoded(enc)

    def _target(self, sample):
        index, _, _, label = sample
        return (index, label)

    def evaluation(self, spec, module):
        return Accuracy()


class Accuracy(Evaluation):
    """Argmax of the logits against the labels."""

    def __init__(self):
        self.indices, self.labels, self.predicted = [], [], []

    def add(self, batch, outputs):
        logits = np.asarray(outputs[0], dtype=np.float64)[:batch.count]
        self.predicted += [int(c) for c in logits.argmax(axis=1)]
        self.indices += [index for index, _ in batch.targets]
        self.labels += [label for _, label in batch.targets]

    def metrics(self):
        return metrics.accuracy(self.predicted, self.labels)

    def predictions(self):
        return [{"index": i, "label": y, "predicted": p}
                for i, y, p in zip(self.indices, self.labels, self.predicted, strict=True)]
