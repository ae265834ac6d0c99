"""One side of a comparison: a run's records, grouped by configuration.

A run is the records of a results folder or file (or a stored history run, analysis/history.py). Its
configurations are keyed by `Result.key` (core/records.py), the one identity report, compare, history and
sweep resumption share; repeats of a configuration are kept as separate processes.
"""

from dataclasses import dataclass

import numpy as np

from ..core.errors import UsageError
from ..core.records import ConfigKey, Result, load_records, machine_description

LIBRARIES = ("torch", "torchvision", "transformers", "numpy", "onnxruntime", "openvino")


@dataclass
class Run:
    """One side of a comparison: the records of a run and where they came from."""

    label: str
    records: list[Result]

    def __post_init__(self):
        self.records = [r if isinstance(r, Result) else Result.from_dict(r, f"{self.label} record {i}")
                        for i, r in enumerate(self.records)]

    def machines(self) -> dict:
        """fingerprint -> description, over the records that carry an environment."""
        return {r.machine: machine_description(r.env) for r in self.records if r.machine}

    def versions(self) -> dict:
        """library -> the set of versions its records were measured with."""
        seen = {}
        for r in self.records:
            for lib, v in ((r.env or {}).get("versions") or {}).items():
                if lib in LIBRARIES and v:
                    seen.setdefault(lib, set()).add(v)
        return seen

    @property
    def started_at(self) -> str | None:
        """When its first record was made (ISO timestamps sort as text)."""
        return min((r.timestamp for r in self.records if r.timestamp), default=None)

    @property
    def machine(self) -> str | None:
        """The fingerprint most of its records carry."""
        machines = [r.machine for r in self.records if r.machine]
        return max(set(machines), key=machines.count, default=None)

    def configurations(self, ignore=()) -> dict[ConfigKey, dict]:
        """key -> the configuration's records in this run: more than one are repeats, each its own process.

        Each entry: `record` (the one shown: the first that did not run ok, else the last), `groups` (the
        passes of each ok record; a multi-instance aggregate's are its instances' passes, pooled), `met`
        (whether each of those met its confidence target), `rounds` (each one's machine probe rounds, or
        None), `median_ms` and `throughput` (the median of the ok records, see stats.relative_change) and
        `confident` (most of its ok records, all of one, met their confidence target).
        """
        usual = self.machine
        pooled = {}
        for r in self.records:
            if r.is_instance and r.instance.get("group"):
                pooled.setdefault(r.instance["group"], []).extend(r.samples_ms or [])
        by_key = {}
        for r in self.records:
            if not r.is_instance:
                # A record whose process died carries no environment: it was measured where its run was.
                by_key.setdefault(r.key(usual).ignoring(ignore), []).append(r)
        configs = {}
        for key, records in by_key.items():
            ok = [r for r in records if r.status == "ok"]
            bad = [r for r in records if r.status != "ok"]
            groups, met, rounds, turns = [], [], [], []
            for r in ok:
                instance = r.instance or {}
                samples = pooled.get(instance.get("group")) if instance.get("aggregate") else r.samples_ms
                if samples:
                    groups.append(np.asarray(samples, dtype=float))
                    met.append(confident(r))
                    probe = (r.probe or {}).get("rounds")
                    rounds.append(probe if probe and sum(x[0] for x in probe) == len(samples) else None)
                    turns.append(r.turns if r.turns and sum(n for n, _ in r.turns) == len(samples) else None)
            medians = [r.median_ms for r in ok]
            rates = [(r.throughput or {}).get("value") for r in ok]
            configs[key] = {
                "record": bad[0] if bad else records[-1], "groups": groups, "met": met, "rounds": rounds,
                "turns": turns,
                "repeats": len(records),
                "median_ms": float(np.median(medians)) if ok and all(medians) else None,
                "throughput": float(np.median(rates)) if ok and all(rates) else None,
                # With several processes their median is what is judged: most must be confident.
                "confident": bool(ok) and 2 * sum(confident(r) for r in ok) > len(ok)}
        return configs


def confident(record: Result) -> bool:
    """Whether a process measured as precisely as asked. One that took turns with others in a sweep
    (drivers/turns.py) ran as long as the sweep said, on passes from many moments of the machine: a
    confidence target on its passes, as if they were alike, says nothing about it, and how far its median
    moves is judged from the spread of processes and runs like any other's."""
    return bool(record.turns) or bool(record.confidence_met)


def from_files(ref) -> Run:
    """A results folder (every results.jsonl below it) or a results.jsonl file, as a comparison side."""
    records = load_records([ref])
    if not records:
        raise UsageError(f"{str(ref)!r} holds no records")
    return Run(str(ref), records)
