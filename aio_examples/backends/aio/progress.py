"""How far a tuning has got, on stderr."""

import os
import sys

from ...core.log import logger


class Progress:
    """A progress bar of a tuning on stderr: the stage it is in, and an estimate of the time left (tqdm's, from
    the stages done so far); none where CI is set or for a tuning that ends at once."""

    def __init__(self, model: str, precision: str):
        self.what, self.bar, self.doing = f"aio tuning {model} {precision}", None, None

    def __enter__(self):
        return self

    def plan(self, stages: int) -> None:
        from tqdm import tqdm

        quiet = os.environ.get("CI", "").lower() in ("1", "true")
        self.bar = tqdm(total=stages, desc=self.what, unit="stage", file=sys.stderr, disable=quiet,
                        dynamic_ncols=True, bar_format="{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")

    def step(self, doing: str, more: bool = False) -> None:
        """The stage before is done; `doing` begins (a stage `more` than planned)."""
        if self.bar is None:
            return
        if more:
            self.bar.total += 1
        if self.doing is not None:
            self.bar.update(1)
        self.doing = doing
        self.bar.set_postfix_str(doing)
        logger.debug("%s: %s", self.what, doing)

    def __exit__(self, kind, *exc):
        if self.bar is not None:
            if kind is None:             # the last stage is done too
                self.bar.update(self.bar.total - self.bar.n)
            self.bar.close()
