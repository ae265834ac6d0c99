"""FLOPs of one pass at batch 1, counted by torch.utils.flop_counter and cached per shape."""

import json

from ..core.paths import cache_dir, write_json_atomic

# How flops_of counts, in the cache key: a count made before attention was counted in full is made again.
COUNTING = "attention counted"


def count_flops(spec, shape: dict) -> int:
    """Multiply-adds x2 of one batch-1 pass of `spec` at `shape`, random weights. A generator decodes over a
    static cache, so every decode step does the same work: it is counted with one and two new tokens and
    extrapolated, rather than run token by token under the counter."""
    from ..models import is_generator

    module = spec.build(shape=shape)
    new = shape.get("new_tokens", 0)
    if not is_generator(spec.task) or new <= 2:
        return _count(spec, shape, module)
    one, two = (_count(spec, {**shape, "new_tokens": n}, module) for n in (1, 2))
    return one + (new - 1) * (two - one)


def _count(spec, shape: dict, module) -> int:
    from ..backends.base import Prepared

    inputs = spec.example_inputs(1, shape, module)
    return flops_of(spec.make_pass(Prepared(module, inputs, "native"), shape))


def flops_of(one_pass) -> int:
    """Multiply-adds x2 that torch's flop counter sees in one call of `one_pass`, with what it misses on CPU made
    visible: nn.MultiheadAttention's fused inference path is turned off for the count (the counter does not look
    inside it: ViT-B/16 counted 22.5 instead of 33.7 GFLOP), and CPU flash attention counts as the other
    scaled-dot-product kernels do."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    aten = torch.ops.aten
    flash = flop_registry[aten._scaled_dot_product_flash_attention]     # takes the op's own arguments

    def cpu_flash(*args, **kwargs):
        return flash(*args, **kwargs)

    cpu_flash._get_raw = True          # the counter's mark for a formula that reads tensors, not shapes
    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad(), FlopCounterMode(display=False, custom_mapping={
                aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash}) as counter:
            one_pass()
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)
    return int(counter.get_total_flops())


def cached_flops(spec, shape: dict) -> int:
    """`count_flops`, remembered on disk by model, shape (and config overrides) and torch version."""
    import torch

    path = cache_dir() / "flops.json"
    shape_key = spec.input_shape(1, shape)         # with any config override: a 2-layer Llama is not the 1B
    key = f"{spec.name}|{json.dumps(shape_key, sort_keys=True)}|torch {torch.__version__}|{COUNTING}"
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    if key not in table:
        table[key] = count_flops(spec, shape)
        write_json_atomic(path, table, indent=1, sort_keys=True)
    return table[key]
