"""The report across machines: each configuration side by side on every machine, the best configuration of each
machine under a latency bound and, given prices per hour, what a million inferences cost on each.

A machine is named by `env["machine_type"]` (the kind a user gave it, e.g. a cloud instance type) when its
records carry one, else by its hardware fingerprint (`Result.machine`): instance types with the same CPUs but
different memory share a fingerprint, not a price. Only configurations that ran ok count, each with its latest
record per machine (as in the summary); a multi-instance run counts with its aggregate throughput. The best
configuration is chosen per workload (model, input shape, dataset), since throughput at another shape is
another amount of work. Records from one machine get the section only when a bound or prices are asked for.
"""

import html
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import UsageError
from ..core.paths import read_toml
from ..core.records import KEY_FIELDS, Result, machine_fingerprint

# A configuration on any machine (ConfigKey without the machine; the model implies the task).
CONFIG = [f for f in KEY_FIELDS if f not in ("task", "machine")]
WORKLOAD = ["model", "shape", "dataset", "unit"]          # what the best configuration of a machine is chosen for
FIGURES = {"median_ms": "median ms", "p99_ms": "p99 ms", "throughput": "throughput"}
PRICE_KEYS = ("currency", "prices")
PRICES_ACCEPTED = "a TOML file with a [prices] table of machine = price per hour (machine_type or fingerprint)"

INTRO = ("<p>The same configurations on each machine the records come from. A machine is its "
         "<code>machine_type</code> when the records carry one, else its hardware fingerprint. Only configurations "
         "that ran ok, the latest record of each on each machine; a multi-instance run with its aggregate "
         "throughput. p99 is the 99th percentile of latency (the 90th where a record has no p99).</p>")
WHOLE_MACHINE = ("<p>A price covers the whole machine: a configuration that leaves cores idle pays for them (the "
                 "core share column says how many it used). Cost per million = price per hour / (throughput x 3600) "
                 "x 1e6, an inference being one unit of the throughput (an image, a sample, a token).</p>")


@dataclass
class Prices:
    """Prices per hour of machines, by machine_type or fingerprint."""

    currency: str
    per_hour: dict
    path: str = ""

    def of(self, machine: str, fingerprint: str | None) -> float | None:
        return self.per_hour.get(machine, self.per_hour.get(fingerprint))


def machine_name(env: dict | None) -> str | None:
    """What the report calls a machine: its machine_type, else its hardware fingerprint (None without either)."""
    env = env or {}
    return str(env["machine_type"]) if env.get("machine_type") else machine_fingerprint(env)


def describe(env: dict) -> str:
    """CPU model, architecture, logical CPUs and the CPUs the machine offered (when recorded)."""
    text = f"{env.get('cpu_model') or 'unknown CPU'} ({env.get('arch') or '?'}), {env.get('logical_cpus') or '?'} logical CPUs"
    return text + (f", {env['machine_cpus']} CPUs offered" if env.get("machine_cpus") else "")


def _as_result(r) -> Result:
    return r if isinstance(r, Result) else Result.from_dict(r)


def machines(records) -> list[dict]:
    """One entry per machine the records were measured on, by name: fingerprint(s), description and the CPUs
    its core share counts against (machine_cpus, else logical CPUs); the latest record's environment describes it."""
    seen = {}
    for r in map(_as_result, records):
        env = r.env or {}
        if not env.get("cpu_model"):
            continue
        m = seen.setdefault(machine_name(env), {"machine": machine_name(env), "fingerprints": []})
        if r.machine not in m["fingerprints"]:
            m["fingerprints"].append(r.machine)
        m.update(description=describe(env), cpus=env.get("machine_cpus") or env.get("logical_cpus"))
    return [seen[name] for name in sorted(seen)]


def _tail(lat: dict):
    return lat["p99"] if lat.get("p99") is not None else lat.get("p90")


def frame(records):
    """One row per configuration and machine whose latest record ran ok: the configuration's columns, machine,
    fingerprint, median_ms, p99_ms (p90 without a p99), throughput, unit, cores (threads x instances), cpus and
    core_share (cores / cpus)."""
    import pandas as pd

    rows = []
    for r in map(_as_result, records):
        if r.is_instance:
            continue                 # a multi-instance run counts with its aggregate record
        env, lat, tp = r.env or {}, r.latency_ms or {}, r.throughput or {}
        cpus = env.get("machine_cpus") or env.get("logical_cpus")
        cores = r.threads * r.instances
        key = r.key()._asdict()
        rows.append({**{k: key[k] for k in CONFIG}, "task": r.task, "machine": machine_name(env) or "unknown",
                     "fingerprint": r.machine or "unknown", "status": r.status, "median_ms": lat.get("median"),
                     "p99_ms": _tail(lat), "throughput": tp.get("value"), "unit": tp.get("unit") or "",
                     "cores": cores, "cpus": cpus, "core_share": cores / cpus if cpus else None,
                     "timestamp": r.timestamp})
    columns = [*CONFIG, "task", "machine", "fingerprint", "median_ms", "p99_ms", "throughput", "unit", "cores", "cpus",
               "core_share"]
    if not rows:
        return pd.DataFrame(columns=columns)
    df = pd.DataFrame(rows).sort_values("timestamp", kind="stable")
    df = df.drop_duplicates([*CONFIG, "task", "machine"], keep="last")       # the latest wins, whatever its status
    df = df[df.status == "ok"]
    return df.sort_values([*CONFIG, "machine"]).reset_index(drop=True)[columns]


def side_by_side(df):
    """One row per configuration, and per machine its median, p99 and throughput (columns (machine, figure));
    empty where the configuration did not run ok on that machine."""
    import pandas as pd

    if df.empty:
        return pd.DataFrame()
    wide = df.set_index([*CONFIG, "unit", "machine"])[list(FIGURES)].unstack("machine")
    wide = wide.swaplevel(axis=1)
    names = sorted(df.machine.unique())
    wide = wide.reindex(columns=pd.MultiIndex.from_product([names, list(FIGURES)]))
    return wide.rename(columns=FIGURES, level=1).reset_index()


def check_bound(latency_ms) -> float | None:
    """A latency bound in ms: None (no bound) or a finite number > 0."""
    if latency_ms is None:
        return None
    ok = isinstance(latency_ms, (int, float)) and not isinstance(latency_ms, bool) and math.isfinite(latency_ms)
    if not ok or latency_ms <= 0:
        raise UsageError(f"--latency-ms {latency_ms!r} is invalid; accepted: a number of milliseconds > 0")
    return float(latency_ms)


def best(df, latency_ms: float | None = None, prices: Prices | None = None):
    """Per workload (model, shape, dataset, unit) and machine, the configuration with the highest throughput
    among those whose p99 is within `latency_ms` (all of them without a bound; fewer cores, then lower p99,
    break a tie). With prices: price_per_hour, currency, cost_per_million, inferences_per_dollar, and `cheapest`
    for the lowest cost per million of each workload among the priced machines."""
    import pandas as pd

    ok = df.dropna(subset=["throughput"])
    ok = ok[ok.throughput > 0]
    if latency_ms is not None:
        ok = ok[ok.p99_ms.notna() & (ok.p99_ms <= latency_ms)]
    ok = ok.sort_values(["throughput", "cores", "p99_ms"], ascending=[False, True, True], kind="stable")
    top = ok.drop_duplicates([*WORKLOAD, "machine"], keep="first").sort_values([*WORKLOAD, "machine"])
    top = top.reset_index(drop=True)
    if prices is None:
        return top
    price = pd.Series([prices.of(m, f) for m, f in zip(top.machine, top.fingerprint)], index=top.index, dtype=float)
    top = top.assign(price_per_hour=price, currency=prices.currency,
                     cost_per_million=price / (top.throughput * 3600) * 1e6,
                     inferences_per_dollar=top.throughput * 3600 / price, cheapest=False)
    priced = top.dropna(subset=["cost_per_million"])
    if not priced.empty:
        top.loc[priced.groupby(WORKLOAD).cost_per_million.idxmin().values, "cheapest"] = True
    return top


def read_prices(path, known: list[dict]) -> Prices:
    """The prices file (`currency`, optional, default USD; `[prices]`: machine = price per hour), checked
    against the machines of the results (`known`: machines()). Any bad input is a one-line UsageError."""
    where = f"--prices {str(path)!r}"
    data = read_toml(path, "--prices", PRICES_ACCEPTED)
    unknown = sorted(set(data) - set(PRICE_KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; accepted: {', '.join(PRICE_KEYS)}")
    table = data.get("prices")
    if not isinstance(table, dict) or not table:
        found = "has no [prices] table" if table is None else f"has prices = {table!r}, not a table of prices"
        raise UsageError(f"{where} {found}; accepted: {PRICES_ACCEPTED}")
    currency = data.get("currency", "USD")
    if not isinstance(currency, str) or not currency.strip():
        raise UsageError(f"{where}: currency {currency!r} is not a currency name; accepted: a name such as \"USD\"")
    for name, value in table.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise UsageError(f"{where}: the price of {name!r} is {value!r}, not a number; accepted: a price per hour > 0")
        if value <= 0:
            problem = f"negative ({value})" if value < 0 else "0"
            raise UsageError(f"{where}: the price of {name!r} is {problem}; accepted: a price per hour > 0")
    names = {m["machine"] for m in known} | {f for m in known for f in m["fingerprints"]}
    strangers = [n for n in table if n not in names]
    if strangers:
        have = "; ".join(f"{m['machine']} (fingerprint {', '.join(m['fingerprints'])})"
                         if m["fingerprints"] != [m["machine"]] else m["machine"] for m in known) or "none"
        raise UsageError(f"{where}: machine(s) {', '.join(map(repr, strangers))} not in the results; accepted: the "
                         f"results' machines, by machine_type or fingerprint: {have}")
    return Prices(currency=currency.strip(), per_hour={k: float(v) for k, v in table.items()}, path=str(path))


@dataclass
class Fleet:
    """The section's inputs: the machines, the ok rows, the bound and the prices."""

    machines: list
    rows: object                                # frame()
    latency_ms: float | None = None
    prices: Prices | None = None
    best: object = field(init=False)            # best()

    def __post_init__(self):
        self.best = best(self.rows, self.latency_ms, self.prices)

    @classmethod
    def of(cls, records, prices=None, latency_ms=None) -> "Fleet":
        """From the records, a prices file (path or None) and a bound in ms (or None); bad input raises UsageError."""
        latency_ms = check_bound(latency_ms)
        known = machines(records)
        return cls(known, frame(records), latency_ms, read_prices(prices, known) if prices is not None else None)

    @property
    def shown(self) -> bool:
        """Whether the report gets the section: rows from 2+ machines, or a bound or prices asked for."""
        return self.rows.machine.nunique() >= 2 or self.latency_ms is not None or self.prices is not None

    def unpriced(self) -> list[str]:
        if self.prices is None:
            return []
        return [m["machine"] for m in self.machines
                if all(self.prices.of(m["machine"], f) is None for f in m["fingerprints"])]

    def out_of_bound(self) -> list[str]:
        """`workload on machine` for each machine with ok rows but no configuration within the bound."""
        have = set(zip(*(self.best[c] for c in [*WORKLOAD, "machine"])))
        rows = self.rows.dropna(subset=["throughput"])
        return sorted({f"{workload(m, s, d)} on {mach}" for m, s, d, u, mach in zip(
            *(rows[c] for c in [*WORKLOAD, "machine"])) if (m, s, d, u, mach) not in have})

    def cheapest_lines(self) -> list[str]:
        """The cheapest machine of each workload, a line each (for the command line)."""
        if self.prices is None:
            return []
        bound = f"p99 within {self.latency_ms:g} ms" if self.latency_ms is not None else "no latency bound"
        lines = [f"cheapest machine per model ({bound}; {self.prices.currency} per hour from {self.prices.path}):"]
        cheapest = {tuple(k): r for k, r in zip(zip(*(self.best[c] for c in WORKLOAD)), self.best.itertuples())
                    if r.cheapest}
        for key in sorted(set(zip(*(self.rows[c] for c in WORKLOAD)))):
            label, r = workload(*key[:3]), cheapest.get(key)
            if r is None:
                lines.append(f"  {label}: no priced machine" + (" has a configuration within the bound"
                                                                 if self.latency_ms is not None else ""))
                continue
            lines.append(f"  {label}: {r.machine}, {r.cost_per_million:.4g} {r.currency} per million "
                         f"{per(r.unit)} ({_config(r)}, {r.throughput:.2f} {r.unit}, p99 {r.p99_ms:.2f} ms)")
        return lines


def workload(model, shape, dataset) -> str:
    return " ".join([model, *([shape] if shape else []), *([dataset] if dataset not in ("", "synthetic") else [])])


def per(unit: str) -> str:
    """What a unit of throughput counts: `images/s` -> images."""
    return unit.removesuffix("/s") if unit and unit.endswith("/s") else "inferences"


def _config(r) -> str:
    layout = f"{r.threads} thread(s)" + (f" x {r.instances} instances" if r.instances > 1 else "")
    return f"{r.backend} {r.precision}, batch {r.batch_size}, {layout}"


# ---------------------------------------------------------------- outputs

def _num(spec: str):
    return lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else spec.format(v)


BEST_COLUMNS = {"model": "model", "shape": "shape", "dataset": "dataset", "machine": "machine", "backend": "backend",
                "precision": "precision", "batch_size": "batch", "threads": "threads", "instances": "instances",
                "throughput": "throughput", "unit": "unit", "p99_ms": "p99 ms", "median_ms": "median ms",
                "core_share": "core share"}
COST_COLUMNS = {"price_per_hour": "price per hour", "cost_per_million": "cost per million",
                "inferences_per_dollar": "inferences per unit of currency", "cheapest": "cheapest"}


def _best_shown(fl: Fleet):
    import pandas as pd

    shown = fl.best.copy()
    for c in ("throughput", "p99_ms", "median_ms"):
        shown[c] = shown[c].map(_num("{:.2f}"))
    shown["core_share"] = [f"{c} of {n:.0f} ({100 * s:.0f}%)" if pd.notna(s) else f"{c}"
                           for c, n, s in zip(fl.best.cores, fl.best.cpus, fl.best.core_share)]
    columns = dict(BEST_COLUMNS)
    if (shown.dataset == "synthetic").all():
        columns.pop("dataset")
    if fl.prices is not None:
        shown["price_per_hour"] = shown.price_per_hour.map(_num("{:.4g}"))
        shown["cost_per_million"] = shown.cost_per_million.map(_num("{:.4g}"))
        shown["inferences_per_dollar"] = shown.inferences_per_dollar.map(_num("{:,.0f}"))
        shown["cheapest"] = shown.cheapest.map(lambda v: "yes" if v else "")
        columns |= {k: v.replace("unit of currency", fl.prices.currency) for k, v in COST_COLUMNS.items()}
        columns["price_per_hour"] += f" ({fl.prices.currency})"
        columns["cost_per_million"] += f" ({fl.prices.currency})"
    return shown[list(columns)].rename(columns=columns)


def _side_shown(fl: Fleet):
    wide = side_by_side(fl.rows)
    if wide.empty:
        return wide
    for col in wide.columns:
        if col[1] in FIGURES.values():
            wide[col] = wide[col].map(_num("{:.2f}"))
    keep = [c for c in wide.columns
            if c[0] not in ("allocator", "scenario", "dataset", "fpmath", "env_axes") or wide[c].nunique() > 1]
    return wide[keep].rename(columns={"batch_size": "batch"}, level=0)


def _machines_shown(fl: Fleet):
    import pandas as pd

    rows = [{"machine": m["machine"], "fingerprint": ", ".join(m["fingerprints"]), "description": m["description"],
             **({f"price per hour ({fl.prices.currency})":
                 next((f"{p:.4g}" for f in [m["machine"], *m["fingerprints"]] if (p := fl.prices.per_hour.get(f))), "")}
                if fl.prices is not None else {})} for m in fl.machines]
    return pd.DataFrame(rows)


def _notes(fl: Fleet) -> list[str]:
    notes = []
    if fl.latency_ms is not None:
        notes.append(f"Latency bound: p99 within {fl.latency_ms:g} ms.")
        if fl.out_of_bound():
            notes.append("No configuration within the bound: " + "; ".join(fl.out_of_bound()) + ".")
    if fl.unpriced():
        notes.append("No price, so no cost columns, for: " + ", ".join(fl.unpriced()) + ".")
    return notes


def table(fl: Fleet) -> str:
    """The section "Machines side by side" (HTML, without its heading)."""
    parts = [INTRO, _machines_shown(fl).to_html(index=False)]
    parts.append("<h3>Configurations side by side</h3>")
    wide = _side_shown(fl)
    parts.append(wide.to_html(index=False) if not wide.empty else "<p>No configuration ran ok.</p>")
    parts.append("<h3>Best configuration per machine</h3>")
    parts.append("<p>Per model (and input shape) and machine, the configuration with the highest throughput "
                 + ("among those whose p99 is within the bound" if fl.latency_ms is not None else "(no latency bound)")
                 + "; core share: threads x instances of the machine's CPUs.</p>")
    parts += [f"<p>{html.escape(n)}</p>" for n in _notes(fl)]
    if fl.prices is not None:
        parts.append(WHOLE_MACHINE)
    parts.append(_best_shown(fl).to_html(index=False) if not fl.best.empty else "<p>None.</p>")
    if fl.prices is not None:
        parts.append("<h3>Cheapest machine per model</h3>")
        parts.append("<ul>" + "".join(f"<li>{html.escape(line.strip())}</li>" for line in fl.cheapest_lines()[1:])
                     + "</ul>")
    return "\n".join(parts)


def write(fl: Fleet, out: Path) -> dict:
    """fleet.csv (the best configuration per machine, with the cost columns when priced) and fleet.md."""
    csv, md = out / "fleet.csv", out / "fleet.md"
    fl.best.drop(columns=["task"]).to_csv(csv, index=False)
    wide = _side_shown(fl)
    if not wide.empty:
        wide.columns = [" ".join(str(p) for p in c if p) for c in wide.columns]
    parts = ["# Machines side by side", "", _machines_shown(fl).to_markdown(index=False), "",
             "## Best configuration per machine", "", *(n + "\n" for n in _notes(fl))]
    if fl.prices is not None:
        parts += [html.unescape(WHOLE_MACHINE.removeprefix("<p>").removesuffix("</p>")), ""]
    parts += [_best_shown(fl).to_markdown(index=False, disable_numparse=True) if not fl.best.empty else "None.", ""]
    if fl.prices is not None:
        parts += ["## Cheapest machine per model", "", *(f"- {line.strip()}" for line in fl.cheapest_lines()[1:]), ""]
    parts += ["## Configurations side by side", "",
              wide.to_markdown(index=False, disable_numparse=True) if not wide.empty else "No configuration ran ok.", ""]
    md.write_text("\n".join(parts))
    return {"fleet_csv": csv, "fleet_md": md}
