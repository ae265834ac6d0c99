"""The cached tuning decision: the key it is filed under (the model's inputs, precision, threads, CPU, library
versions and what tuning offered), its file, and a decision taken before under a nearby key, which a tuning on a
busy machine keeps rather than its own choice."""

import json
import platform

from . import settings


def key(model, example_inputs, precision, threads, ctx, engines: dict) -> dict:
    """What a decision depends on: it is reused where all of this is the same (and kept by a tuning on a busy
    machine where only PRIOR_IGNORES differ)."""
    from ...machine.environment import capture
    from ..artifacts import describe_inputs

    env = capture({})
    knobs_on, _ = settings.knob_settings()
    key = {"inputs": describe_inputs(example_inputs), "precision": precision, "threads": threads,
           "cpu": f"{env.get('cpu_model')}|{platform.machine()}|{','.join(env.get('isa') or [])}",
           "versions": env["versions"], "strategies": list(settings.strategies_for(model, engines)),
           "output_checked": ctx.check is not None,      # decisions taken without the check are not reused
           # the knobs on offer: a decision taken before a knob was added tunes again
           "knobs_tuned": knobs_on and {s: [n for n, _ in k] for s, k in settings.KNOBS.items()},
           "split_tuned": settings.split_settings()[0], "rows_tuned": settings.rows_setting(),
           "finalist_margin": settings.FINALIST_MARGIN}
    if ctx.fpmath != "strict":           # fast math is a configuration of its own (strict keeps the keys it had)
        key["fpmath"] = ctx.fpmath
    return key


def file(model_name: str, key: dict):
    """Where the decision for `key` is cached (beside it, key.json: the key itself)."""
    from ..artifacts import artifact_dir

    return artifact_dir("tuning", model_name, **key) / "decision.json"


def load(path) -> dict | None:
    try:
        decision = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    decision.setdefault("mode", "thorough")       # taken before quick tunings existed: every stage ran
    return decision


def save(path, decision: dict) -> None:
    from ...core.paths import write_json_atomic

    write_json_atomic(path, decision, indent=1)


PRIOR_IGNORES = ("versions", "strategies")     # what may differ between a prior decision's key and ours


def prior(decision_file, key: dict, prepared: dict) -> dict | None:
    """The newest cached decision for the same model, inputs, precision, threads and CPU whose key differs
    only in library versions or the strategies on offer, naming a strategy prepared now."""
    found = []
    for other in decision_file.parent.parent.glob(f"{decision_file.parent.name.rsplit('-', 1)[0]}-*/decision.json"):
        try:
            their_key = json.loads((other.parent / "key.json").read_text())
            decision = json.loads(other.read_text())
        except (OSError, ValueError):
            continue
        same = all(their_key.get(k) == v for k, v in key.items() if k not in PRIOR_IGNORES)
        if other != decision_file and same and decision.get("strategy") in prepared:
            differs = [k for k in PRIOR_IGNORES if their_key.get(k) != key.get(k)]
            found.append((other.stat().st_mtime, {"strategy": decision["strategy"], "file": str(other),
                                                  "why": " and ".join(f"other {k}" for k in differs) or "this key"}))
    return max(found, key=lambda f: f[0])[1] if found else None
