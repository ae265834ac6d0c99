"""Recommendation: DLRM (Naumov et al., 2019) in MLPerf's Criteo 1TB configuration, written in plain torch.

A bottom MLP (13-512-256-128, ReLU) over the 13 dense features; 26 categorical features, each a sum-pooled bag
of rows of its own `nn.EmbeddingBag` table (dimension 128); the pairwise dot products of those 27 vectors (the
strictly lower triangle: 351) beside the bottom MLP's output; a top MLP (479-1024-1024-512-256-1, ReLU) and a
sigmoid: the click probability, (batch, 1). Module names follow the reference implementation (dlrm_s_pytorch.py:
`bot_l`, `emb_l`, `top_l`).

Tables: MLPerf's Criteo 1TB row counts (hashed to at most 40M rows: 204M rows, 104 GB in fp32), each capped at
ROW_CAP = 100,000 rows (8 tables are: 921,198 rows, 472 MB in all). Lookups: MLPerf DLRMv2's multi-hot counts per table (3, 2, 1, ... 100, 27,
...: 214 rows per sample), with uniformly drawn indices. (DLRMv2 replaces the dot interaction with a DCNv2
cross network; this is the dot-interaction DLRM of MLPerf's earlier rounds with DLRMv2's lookups.)
"""

import itertools
from dataclasses import dataclass

import torch
from torch import nn

from .base import ModelSpec, unit_variance

# Rows of the 26 categorical features' tables in MLPerf's Criteo 1TB setup (--max-ind-range 40000000)
CRITEO_1TB_ROWS = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209,
                   11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36)
# Rows looked up per sample in each table: MLPerf DLRMv2's synthetic multi-hot Criteo (--multi_hot_sizes)
DLRM_V2_MULTI_HOT = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
ROW_CAP = 100_000           # rows per table: 472 MB of tables, a few seconds to build, instead of 104 GB
DENSE_FEATURES = 13


def _mlp(widths: tuple, last: nn.Module) -> nn.Sequential:
    layers = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(widths)):
        layers += [nn.Linear(n_in, n_out), last if i == len(widths) - 2 else nn.ReLU()]
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """(dense, indices, offsets) in, click probabilities (batch, 1) out.

    `dense`: float32 (batch, 13). `indices`: int64, every table's lookups one table after another, table t's
    batch * multi_hot[t] row ids together. `offsets`: int64 (26, batch), where each sample's bag starts within its
    table's ids (`nn.EmbeddingBag`'s offsets). Plain tensors, so torch.export, ONNX and OpenVINO can trace it.
    """

    def __init__(self, rows: tuple, multi_hot: tuple, bottom: tuple, top: tuple):
        super().__init__()
        self.multi_hot = tuple(multi_hot)
        self.bot_l = _mlp(bottom, nn.ReLU())
        self.emb_l = nn.ModuleList(nn.EmbeddingBag(n, bottom[-1], mode="sum") for n in rows)
        self.top_l = _mlp(top, nn.Sigmoid())
        features = len(rows) + 1
        below, right = torch.tril_indices(features, features, -1)
        self.register_buffer("pairs", below * features + right, persistent=False)

    def forward(self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        batch = dense.shape[0]
        x = self.bot_l(dense)
        vectors, start = [x], 0
        for table, (bag, hot) in enumerate(zip(self.emb_l, self.multi_hot)):
            vectors.append(bag(indices[start:start + batch * hot], offsets[table]))
            start += batch * hot
        stacked = torch.stack(vectors, 1)
        dots = torch.bmm(stacked, stacked.transpose(1, 2)).flatten(1)[:, self.pairs]
        return self.top_l(torch.cat([x, dots], 1))


def criteo_batch(module: DLRM, batch_size: int, seed: int) -> tuple:
    """A seeded Criteo-like batch: dense features as log(1 + count) (Criteo's preprocessing) of counts with
    exponential tails at scales from 1 to 1000, and uniformly drawn row ids in the EmbeddingBag form."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.empty(batch_size, DENSE_FEATURES).exponential_(generator=gen) * torch.logspace(0, 3, DENSE_FEATURES)
    indices = torch.cat([torch.randint(bag.num_embeddings, (batch_size * hot,), generator=gen)
                         for bag, hot in zip(module.emb_l, module.multi_hot)])
    offsets = torch.stack([torch.arange(batch_size) * hot for hot in module.multi_hot])
    return torch.log1p(counts.floor()), indices, offsets


@dataclass(frozen=True)
class Recommender(ModelSpec):
    """A DLRM over capped Criteo tables, random weights rescaled to unit variance per layer (base.unit_variance).
    Its shape is the batch size alone: throughput counts samples."""

    rows: tuple = CRITEO_1TB_ROWS
    multi_hot: tuple = DLRM_V2_MULTI_HOT
    row_cap: int = ROW_CAP
    embedding_dim: int = 128
    bottom_mlp: tuple = (512, 256)          # and then embedding_dim
    top_mlp: tuple = (1024, 1024, 512, 256)  # and then the logit

    @property
    def family(self) -> str:
        return "recommendation"

    def _table_rows(self) -> tuple:
        return tuple(min(n, self.row_cap) for n in self.rows)

    def _widths(self) -> tuple[tuple, tuple]:
        """The bottom MLP's (13 ... embedding_dim) and the top MLP's (embedding_dim + the pairwise dot products of
        the 27 vectors ... 1)."""
        features = len(self.rows) + 1
        return ((DENSE_FEATURES, *self.bottom_mlp, self.embedding_dim),
                (self.embedding_dim + features * (features - 1) // 2, *self.top_mlp, 1))

    def _build_module(self, shape):
        return DLRM(self._table_rows(), self.multi_hot, *self._widths())

    random_weights = "random-unit-variance"

    def _initialise(self, module, shape):
        unit_variance(module, criteo_batch(module, 256, seed=7))

    def example_inputs(self, batch_size, shape, module):
        return criteo_batch(module, batch_size, seed=1234)

    def calibration_inputs(self, batch_size, shape, module, n):
        return [criteo_batch(module, batch_size, seed=99 + i) for i in range(n)]

    def weight_bytes(self):
        mlp = sum((n_in + 1) * n_out for widths in self._widths() for n_in, n_out in itertools.pairwise(widths))
        return (sum(self._table_rows()) * self.embedding_dim + mlp) * 4

    def memory_estimate(self, batch_size, shape):
        """The built model's fp32 weights, the row ids and offsets, and a sample's activations: 27 vectors, their
        dot products, the widest MLP layers."""
        features = len(self.rows) + 1
        activations = features * self.embedding_dim + features * features + 4 * max(self.top_mlp)
        ids = (sum(self.multi_hot) + len(self.rows)) * 8
        return self.weight_bytes() + batch_size * (activations * 4 + ids)
