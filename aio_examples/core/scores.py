"""How a task score reads. Most (top-1, mAP, F1, accuracy) are fractions where higher is better, shown in
points (x100) and compared in points. A word error rate is a fraction where lower is better. Perplexity and
mean negative log-likelihood are no fractions and lower is better: shown as they are and compared relative
to the reference (a rise of 0.01 means 1%)."""

LOWER_IS_BETTER = frozenset({"wer", "perplexity", "nll"})
UNBOUNDED = frozenset({"perplexity", "nll"})


def loss(name: str, reference: float, value: float) -> float:
    """How much worse `value` is than `reference` (negative: better): in points/100 for fractions, relative
    to the reference for unbounded scores."""
    worse = value - reference if name in LOWER_IS_BETTER else reference - value
    if name in UNBOUNDED:
        return worse / abs(reference) if reference else 0.0
    return worse


def shown(name: str, value: float) -> str:
    return f"{value:.4g}" if name in UNBOUNDED else f"{100 * value:.1f}"


def shown_loss(name: str, amount: float) -> str:
    """A loss (or allowance) as a reader says it: `0.8 pt` (points) or `1.2%`."""
    return f"{100 * amount:.3g}%" if name in UNBOUNDED else f"{100 * amount:.3g} pt"
