"""GLUE-style text classification: a tab-separated file with a header row, scored by the GLUE task's metrics.

The file is one of GLUE's dev.tsv files (or any file laid out like them, e.g. a Hugging Face `glue` split
saved as TSV): a `label` column holding each row's class as a whole number (the index of the model head's
output; for STS-B the similarity score) and the text columns GLUE uses, looked for in this order: sentence1 +
sentence2 (MRPC, RTE, WNLI, STS-B), question1 + question2 (QQP), question + sentence (QNLI), premise +
hypothesis, sentence (SST-2, CoLA's headed form). Other columns are ignored. Fields are read unquoted
(`csv.QUOTE_NONE`), as GLUE's files need. Texts are tokenized as transformers' run_glue.py does (a pair
together, truncated to `--seq-len`).

The task is named by the file's folder, as GLUE's own layout names it (glue_data/MRPC/dev.tsv), or by a part of
the file's name before an underscore or dot (mrpc_dev.tsv, sst2.tsv), case and dashes ignored (STS-B, SST-2).
Its metrics are those of `evaluate`'s glue metric, computed with scikit-learn and scipy as it computes them
(metrics.glue): Matthews correlation (CoLA), Pearson and Spearman correlation (STS-B, whose prediction is the
model's single output), accuracy and F1 (MRPC, QQP), accuracy (the others, and a file that names no task). A
row's prediction is otherwise the argmax of the logits; predictions list each row's `index` (0-based among the
file's rows), label and prediction.
"""

import csv
import io
import re

import numpy as np

from ..core.errors import UsageError
from . import metrics
from .base import Evaluation, LabelledDataset, read_text, tokenizer_of

TEXT_COLUMNS = (("sentence1", "sentence2"), ("question1", "question2"), ("question", "sentence"),
                ("premise", "hypothesis"), ("sentence",))
FORMAT = ("a tab-separated file with a header row naming a 'label' column (a whole number class; STS-B: a score) "
          "and the text columns " + ", ".join("+".join(c) for c in TEXT_COLUMNS))
REFERENCE = {"cola": "Matthews correlation", "stsb": "Pearson and Spearman correlation of the model's single output",
             "mrpc": "accuracy and F1", "qqp": "accuracy and F1"}


def task_of(path) -> str | None:
    """The GLUE task a file's name or folder names (metrics.GLUE_TASKS), or None."""
    names = [*re.split(r"[_.]", path.stem), path.parent.name]
    return next((key for key in (n.lower().replace("-", "") for n in names) if key in metrics.GLUE_TASKS), None)


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
        self.task = task_of(self.path)
        samples = []
        for row in rows:
            if not any(field.strip() for field in row):
                continue
            if len(row) <= max(label, *text):
                raise UsageError(f"{str(self.path)!r} line {rows.line_num} has {len(row)} of the header's "
                                 f"{len(header)} fields; accepted: {FORMAT}")
            samples.append((len(samples), rows.line_num, tuple(row[i] for i in text), self._label(row[label], rows)))
        return samples

    def _label(self, field: str, rows) -> int | float:
        """A row's class, or STS-B's similarity score."""
        field = field.strip()
        if self.task == "stsb":
            try:
                return float(field)
            except ValueError:
                pass
        elif field.isdecimal():
            return int(field)
        raise UsageError(f"{str(self.path)!r} line {rows.line_num}: label {field[:40]!r} is not "
                         f"{'a score' if self.task == 'stsb' else 'a class number'}; accepted: {FORMAT}")

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
        return GlueEvaluation(self.task)

    def protocol(self, spec, shape):
        if self.task is None:
            return None
        return {"protocol": "reference", "follows": f"GLUE {self.task} as evaluate's glue metric scores it: "
                f"{REFERENCE.get(self.task, 'accuracy')} (scikit-learn, scipy)", "shape": {"seq_len": shape["seq_len"]}}


class GlueEvaluation(Evaluation):
    """Each row's prediction (the argmax of the logits; STS-B: its single output) against the labels, scored by
    the task's metrics."""

    def __init__(self, task: str | None):
        self.task = task
        self.indices, self.labels, self.predicted = [], [], []

    def add(self, batch, outputs):
        logits = np.asarray(outputs[0], dtype=np.float64)[:batch.count]
        if self.task == "stsb":
            if logits.shape[1] != 1:
                raise UsageError(f"GLUE stsb is scored on a regression's single output, and the model has "
                                 f"{logits.shape[1]}; accepted: an STS-B model (num_labels 1)")
            self.predicted += [float(v) for v in logits[:, 0]]
        else:
            self.predicted += [int(c) for c in logits.argmax(axis=1)]
        self.indices += [index for index, _ in batch.targets]
        self.labels += [label for _, label in batch.targets]

    def metrics(self):
        return metrics.glue(self.task, self.predicted, self.labels)

    def predictions(self):
        return [{"index": i, "label": y, "predicted": p}
                for i, y, p in zip(self.indices, self.labels, self.predicted, strict=True)]
