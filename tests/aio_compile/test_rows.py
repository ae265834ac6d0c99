"""Only the rows the output reads: the graph rewritten so the ops before a row pick compute that row alone."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from aio_examples.aio_compile.rows import prune


class Encoder(torch.nn.Module):
    """Pre-norm transformer blocks (ViT's order) or post-norm (BERT's), a padding mask, a head on one token."""

    def __init__(self, width=32, heads=4, blocks=2, row=0, causal=False, post_norm=False, pool="pick",
                 square_mask=False):
        super().__init__()
        self.heads, self.row, self.causal, self.post_norm, self.pool = heads, row, causal, post_norm, pool
        self.square_mask = square_mask
        self.embed = torch.nn.Embedding(50, width)
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict({
            "qkv": torch.nn.Linear(width, 3 * width), "out": torch.nn.Linear(width, width),
            "ln1": torch.nn.LayerNorm(width), "ln2": torch.nn.LayerNorm(width),
            "up": torch.nn.Linear(width, 4 * width), "down": torch.nn.Linear(4 * width, width)}) for _ in range(blocks))
        self.head = torch.nn.Linear(width, 3)

    def forward(self, ids, mask):
        x = self.embed(ids)
        b, s, w = x.shape
        keep = None if self.causal else (mask[:, None, None, :] > 0)       # padding: [b, 1, 1, s]
        if self.square_mask:                # as transformers expands it: [b, 1, s, s], a row per query
            keep = keep.expand(b, 1, s, s)
        for blk in self.blocks:
            h = x if self.post_norm else blk["ln1"](x)
            q, k, v = blk["qkv"](h).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, keep, is_causal=self.causal)
            x = x + blk["out"](a.transpose(1, 2).reshape(b, s, w))
            x = blk["ln1"](x) if self.post_norm else x
            h = x if self.post_norm else blk["ln2"](x)
            x = x + blk["down"](F.gelu(blk["up"](h)))
            x = blk["ln2"](x) if self.post_norm else x
        return self.head(x[:, self.row] if self.pool == "pick" else x.mean(1))


def inputs(seq=16):
    torch.manual_seed(0)
    mask = torch.ones(2, seq, dtype=torch.long)
    mask[1, seq // 2:] = 0
    return torch.randint(0, 50, (2, seq)), mask


def flops(model, args) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*args)
    return counter.get_total_flops()


@pytest.mark.parametrize("kw", [{}, {"post_norm": True, "square_mask": True}, {"row": -1}, {"row": 5, "causal": True}],
                         ids=["cls-pre-norm", "cls-post-norm-square-mask", "last-token", "causal"])
def test_the_last_block_computes_only_the_row_the_head_reads_and_the_outputs_stay_the_same(kw):
    torch.manual_seed(1)
    model, args = Encoder(**kw).eval(), inputs()
    found = prune(model, args)
    assert found is not None
    gm, narrowed = found.module, found.narrowed
    with torch.no_grad():
        torch.testing.assert_close(gm(*args), model(*args), rtol=1e-5, atol=1e-6)
    # the last block's output projection and feed-forward (and, but for a causal mask, its query side) on
    # one row of 16: its GEMM work falls by most of 15/16
    full, pruned = flops(model, args), flops(gm, args)
    block_ffn = 2 * 2 * 16 * 32 * 128 * 2            # up and down, a batch of 2
    assert full - pruned > 0.8 * block_ffn, (full, pruned)
    assert (found.flops, found.flops_pruned) == (full, pruned) and 0 < found.flops_saved < 0.5
    assert narrowed >= 6
    other = inputs()[0].flip(1), inputs()[1]          # other inputs, same shapes: still the same computation
    with torch.no_grad():
        torch.testing.assert_close(gm(*other), model(*other), rtol=1e-5, atol=1e-6)


def test_a_head_that_reads_every_row_leaves_the_model_as_it_is():
    model, args = Encoder(pool="mean").eval(), inputs()
    assert prune(model, args) is None


def test_a_causal_mask_keeps_the_query_side_whole():
    """A causal mask lines up with the query's first row: taking one query row alone would let it see every
    key. The attention stays whole, the layers after it take the one row."""
    torch.manual_seed(3)
    model, args = Encoder(row=5, causal=True, blocks=1).eval(), inputs()
    gm = prune(model, args).module
    sdpa = [n for n in gm.graph.nodes if n.target == torch.ops.aten.scaled_dot_product_attention.default]
    assert len(sdpa) == 1 and sdpa[0].args[0].meta["val"].shape[-2] == 16
    linears = [n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default]
    assert linears[0].args[0].meta["val"].shape[1] == 16         # the qkv projection on every row
    with torch.no_grad():
        torch.testing.assert_close(gm(*args), model(*args), rtol=1e-5, atol=1e-6)
