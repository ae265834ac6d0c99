"""Do the harness's figures agree with the engines' own benchmark tools, on the same artefact?

Each pair times one artefact two ways in one run, taking turns: the harness (one configuration's process, as
`aio-examples run` starts it: prepared and warmed up once, then measuring one round whenever told) and the engine's
own tool, at the same threads, precision, batch (1) and shape, on the very file the harness's record names:

- openvino, latency median: `benchmark_app -api sync -hint latency` on the cached IR (`backend_info.ir`), with
  the backend's NUM_STREAMS 1, threads and inference precision pinned (`-load_config`, read back from its log) and
  the IR's own input types (`-iop`: it feeds image inputs as u8 otherwise); its median latency.
- onnxruntime, latency median: ONNX Runtime's own profiler, the `model_run` durations of a loop of session runs on
  the cached ONNX file (`backend_info.onnx_path`), the backend's session options (read back), random inputs, the
  first 2 runs dropped.
- llama_cpp, TTFT p50 and TPOT p50: `llama-bench` (built by scripts/build_llama_bench.sh, run on the installed
  llama-cpp-python's own libllama and libggml) on the cached GGUF (`backend_info.file`): pp512 against TTFT, and
  tg128 at depth 512 (the harness decodes after its prompt) per token against TPOT; batch, ubatch, flash attention,
  KV cache type and extra buffer types as the backend loaded them.
- eager, latency median: `torch.utils.benchmark.Timer.adaptive_autorange` of the same pass, built in a process of
  its own (torch alone, as a user's script times it).

A round is `--round-s` seconds of each (a text generator: one generation pass and one llama-bench repetition of
each test); who goes first alternates (harness, tool, tool, harness, ...), so drift of a shared machine hits both,
and each round waits (up to `--quiet-wait`) for a moment other processes leave our cores alone.
Each side's figure is the median of its per-round medians (the harness's rounds read from its record: its passes
split by the counts its probe kept), so a round the machine was quiet for counts once on each side, however many
passes it held; a generator's TTFT and TPOT p50 are over its passes, one a round. A ratio off 1 by more than the
tolerance (5%) is called out; docs/measurement.md explains the ones measured here.

    python3 benchmarks/agreement.py [--pairs openvino,onnxruntime,llama_cpp,eager] [--rounds 6] [--round-s 5]
        [--quiet-wait 30] [--threads 2] [--tolerance 0.05] [--output results/agreement]
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUILD_SCRIPT = ROOT / "scripts" / "build_llama_bench.sh"
ORT_WARMUP_RUNS = 2
LLM_ROUND_S = 60.0       # the budget of one generation pass, for the harness process's timeout (its warm-up's share)


class ToolError(Exception):
    """An engine's tool could not run, or ran with other settings than the harness's (the message says which)."""


@dataclass(frozen=True)
class Pair:
    model: str
    precision: str
    engine: str                  # the harness's backend; its tool follows from it (TOOLS)
    config: tuple = ()           # --config-override items

    @property
    def label(self) -> str:
        layers = [c.split("=")[1] for c in self.config if c.startswith("num_hidden_layers=")]
        return f"{self.model}{f' ({layers[0]} layers)' if layers else ''} {self.precision} {self.engine}"

    @property
    def generator(self) -> bool:
        return self.engine == "llama_cpp"


LLAMA_LAYERS = ("num_hidden_layers=4",)
PAIRS = [*(Pair("resnet_50_v1", p, e) for p in ("fp32", "bf16") for e in ("openvino", "onnxruntime", "eager")),
         *(Pair("llama_3_2_1b", p, "llama_cpp", LLAMA_LAYERS) for p in ("bf16", "int4"))]
FIGURES = {"latency": "latency", "prefill": "prefill (TTFT)", "decode": "decode (TPOT)"}


# --- the engines' tools: each round returns {figure: [ms, ...]} ---------------------------------------------------

class BenchmarkApp:
    """OpenVINO's benchmark_app on the harness's IR, with the backend's compile settings."""

    name = "benchmark_app"

    def __init__(self, record, threads: int, seconds: float, scratch: Path):
        import openvino as ov

        info = record["backend_info"]
        xml, hint = info["ir"], info["precision_hint_read_back"]
        # the properties the backend compiles with (backends/openvino.py): benchmark_app's -nthreads/-nstreams would
        # need -hint none, so they go in a config file beside -hint latency
        self.expected = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": str(threads),
                         "INFERENCE_PRECISION_HINT": hint}
        config = scratch / "benchmark_app.json"
        config.write_text(json.dumps({"CPU": self.expected}))
        inputs = ",".join(f"{port.any_name}:{port.get_element_type().get_type_name()}"
                          for port in ov.Core().read_model(xml).inputs)
        self.argv = [_tool("benchmark_app"), "-m", xml, "-d", "CPU", "-api", "sync", "-hint", "latency",
                     "-infer_precision", hint, "-load_config", str(config), "-iop", inputs, "-t", str(max(1, round(seconds)))]     # whole seconds

    def round(self) -> dict:
        done = subprocess.run(self.argv, capture_output=True, text=True, check=False)
        parsed = parse_benchmark_app(done.stdout + done.stderr)
        check_properties(parsed["properties"], self.expected)
        return {"latency": [parsed["median_ms"]]}


_MS = {"ms": 1.0, "us": 1e-3, "ns": 1e-6}
_OV_TYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}     # benchmark_app prints <Type: 'float32'>


def parse_benchmark_app(text: str) -> dict:
    """benchmark_app's log: its median latency (ms), iteration count, and the compiled model's properties."""
    median = re.search(r"^\[ INFO \]\s+Median:\s+([\d.]+) (ms|us|ns)$", text, re.MULTILINE)   # units as they fit
    count = re.search(r"^\[ INFO \]\s+Count:\s+(\d+) iterations", text, re.MULTILINE)
    if not (median and count):
        raise ToolError(f"benchmark_app printed no median latency: {_last_line(text)}")
    properties = dict(re.findall(r"^\[ INFO \]   ([A-Z][A-Z0-9_]+): (.*)$", text, re.MULTILINE))
    return {"median_ms": float(median[1]) * _MS[median[2]], "count": int(count[1]), "properties": properties}


def check_properties(properties: dict, expected: dict) -> None:
    """ToolError unless benchmark_app's compiled model has the backend's settings."""
    wrong = []
    for name, value in expected.items():
        said = properties.get(name)
        want = f"<Type: '{_OV_TYPES[value]}'>" if name == "INFERENCE_PRECISION_HINT" else value
        if said != want:
            wrong.append(f"{name} {said} (the harness: {want})")
    if wrong:
        raise ToolError("benchmark_app compiled with other settings: " + ", ".join(wrong))


class OrtProfiler:
    """ONNX Runtime's own timing of a run loop: its profiler's `model_run` events, on the harness's ONNX file."""

    name = "ONNX Runtime profiler"

    def __init__(self, record, threads: int, seconds: float, scratch: Path):
        self.path, self.session = Path(record["backend_info"]["onnx_path"]), record["backend_info"]["session"]
        self.threads, self.seconds = threads, seconds

    def round(self) -> dict:
        return {"latency": ort_run_loop(self.path, self.threads, self.seconds, self.session)}


def ort_run_loop(path: Path, threads: int, seconds: float, expected_session: dict | None = None) -> list[float]:
    """ms of each `model_run` ONNX Runtime's profiler timed in a loop of session runs on random inputs for about
    `seconds`, after ORT_WARMUP_RUNS; a new session, made as the backend makes it (its options read back)."""
    import numpy as np

    from aio_examples.backends.onnxruntime import make_session, session_info

    dtypes = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
              "tensor(int32)": np.int32}
    with tempfile.TemporaryDirectory(prefix="agreement-ort-") as profile_dir:
        sess = make_session(path, threads, profile_dir=profile_dir)
        if expected_session is not None and session_info(sess) != expected_session:
            raise ToolError(f"the session's options {session_info(sess)} are not the harness's {expected_session}")
        rng, feed = np.random.default_rng(0), {}
        for i in sess.get_inputs():
            if i.type not in dtypes:
                raise ToolError(f"input {i.name} is {i.type}; random inputs of {', '.join(dtypes)} only")
            feed[i.name] = rng.random([d if isinstance(d, int) else 1 for d in i.shape]).astype(dtypes[i.type])
        for _ in range(ORT_WARMUP_RUNS):
            sess.run(None, feed)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            sess.run(None, feed)
        events = json.loads(Path(sess.end_profiling()).read_text())
    runs = [e["dur"] / 1e3 for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    return runs[ORT_WARMUP_RUNS:]


class LlamaBench:
    """llama.cpp's llama-bench on the harness's GGUF file, with the installed llama-cpp-python's own libraries."""

    name = "llama-bench"

    def __init__(self, record, threads: int, seconds: float, scratch: Path):
        info, shape = record["backend_info"], record["input_shape"]
        self.prompt, self.new_tokens = shape["seq_len"], shape["new_tokens"]
        folder, self.env = llama_bench()
        self.argv = [str(folder / "bin" / "llama-bench"), "-m", info["file"], "-t", str(threads),
                     "-b", str(info["n_batch"]), "-ub", str(info["n_ubatch"]),
                     "-fa", "on" if info["flash_attn"] else "off", "--repack", str(int(info["extra_buffer_types"])),
                     "-ctk", info["kv_cache"], "-ctv", info["kv_cache"], "-r", "1", "-o", "json"]

    def run(self, *test: str) -> dict:
        done = subprocess.run([*self.argv, *test], capture_output=True, text=True, env=self.env, check=False)
        return parse_llama_bench(done.stdout, done.stderr)

    def round(self) -> dict:
        # tg at the prompt's depth: the harness's decode steps attend to the prompt's keys and values
        pp = self.run("-p", str(self.prompt), "-n", "0")
        tg = self.run("-p", "0", "-n", str(self.new_tokens), "-d", str(self.prompt))
        return {"prefill": [ns / 1e6 for ns in pp["samples_ns"]],
                "decode": [ns / 1e6 / self.new_tokens for ns in tg["samples_ns"]]}


def parse_llama_bench(stdout: str, stderr: str = "") -> dict:
    """The one test of llama-bench's JSON output (`-o json`)."""
    try:
        tests = json.loads(stdout)
    except ValueError:
        raise ToolError(f"llama-bench printed no JSON: {_last_line(stderr) or _last_line(stdout)}") from None
    if len(tests) != 1 or not tests[0].get("samples_ns"):
        raise ToolError(f"llama-bench printed {len(tests)} tests, expected one with samples")
    return tests[0]


def llama_bench() -> tuple[Path, dict]:
    """The folder of llama-bench (built once by scripts/build_llama_bench.sh) and the environment that runs it on
    the installed llama-cpp-python's libllama and libggml (checked with ldd)."""
    import llama_cpp

    done = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise ToolError("llama-bench could not be built (scripts/build_llama_bench.sh said why above)")
    folder = Path(done.stdout.strip().splitlines()[-1])
    installed = Path(llama_cpp.__file__).parent / "lib"
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(folder / "lib"), str(installed),
                                                                          os.environ.get("LD_LIBRARY_PATH")]))}
    if shutil.which("ldd"):
        linked = subprocess.run(["ldd", str(folder / "bin" / "llama-bench")], capture_output=True, text=True,
                                env=env, check=False).stdout
        for lib in ("libllama.so", "libggml-cpu.so"):
            where = re.search(rf"^\s*{re.escape(lib)}\S* => (\S+)", linked, re.MULTILINE)
            if not where or Path(where[1]).parent.resolve() != installed.resolve():
                raise ToolError(f"llama-bench would load {lib} from {where[1] if where else 'nowhere'}, "
                                f"not from the installed llama-cpp-python ({installed})")
    built = json.loads((folder / "build.json").read_text())
    print(f"llama-bench of llama-cpp-python {built['llama_cpp_python']} ({folder}), on its libllama and libggml "
          f"({installed}), built with {', '.join(f'{k}={v}' for k, v in built['ggml_cpu_options'].items() if v == 'ON')}",
          flush=True)
    return folder, env


class TorchTimer:
    """torch.utils.benchmark on the eager pass (benchmarks/timer_agreement.py), in a process of its own: timed
    in this one, after the other pairs loaded ONNX Runtime and OpenVINO here, the same pass read 5% slower
    than torch alone (0.947 against 0.992 in the pair run by itself)."""

    name = "torch.utils.benchmark"

    def __init__(self, record, threads: int, seconds: float, scratch: Path):
        import multiprocessing

        from timer_agreement import serve_rounds

        self.conn, child = multiprocessing.Pipe()
        self.process = multiprocessing.get_context("spawn").Process(
            target=serve_rounds, args=(child, record["model"], record["precision"], record["batch_size"], threads,
                                       seconds), daemon=True)
        self.process.start()
        if not self.conn.poll(300) or self.conn.recv() != "ready":
            raise ToolError("torch.utils.benchmark's process did not build the eager pass")

    def round(self) -> dict:
        self.conn.send("round")
        return {"latency": self.conn.recv()}

    def close(self) -> None:
        self.conn.send("stop")
        self.process.join(30)


TOOLS = {"openvino": BenchmarkApp, "onnxruntime": OrtProfiler, "llama_cpp": LlamaBench, "eager": TorchTimer}


# --- the harness ------------------------------------------------------------------------------------------------

def _last_line(text: str) -> str:
    """A tool's last words: where benchmark_app and llama-bench say why they stopped."""
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def _tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise ToolError(f"{name} is not on PATH")
    return found


def _options(pair: Pair, args) -> dict:
    shape = {"seq_len": 512, "new_tokens": 128} if pair.generator else {}
    return {**shape, "backend": pair.engine, "precision": pair.precision, "threads": args.threads, "batch_size": 1,
            "config_override": list(pair.config) or None}


def locate(pair: Pair, args, folder: Path) -> dict:
    """A first short harness run (benchmark(), in a process of its own): its record says whether the pair runs here
    and names the artefact, which the harness makes now, so the process that takes turns finds it cached."""
    from aio_examples.api import benchmark

    options = _options(pair, args)
    return benchmark(pair.model, backend=options.pop("backend"), config=options.pop("config_override"), **options,
                     timeout=20, num_runs=1, output=folder).to_dict()


class Harness:
    """One configuration's process of a run, prepared and warmed up once, measuring one round when told (the
    launcher's protocol: drivers/launcher.py)."""

    def __init__(self, pair: Pair, args, folder: Path):
        from aio_examples.drivers.launcher import PREPARE_TIMEOUT_S
        from aio_examples.drivers.turns import Taker
        from aio_examples.drivers.worker import run_argv

        self.folder, self.pair = folder, pair
        # a generation pass per round (`num_runs`: the rounds); else `round_s` of passes past the stop rule (`keep`),
        # within a timeout the rounds do not reach
        self.seconds = 0.0 if pair.generator else args.round_s
        budget = args.rounds * (LLM_ROUND_S if pair.generator else args.round_s) * 2
        # the probe (a few ms of reference work after each round) keeps each round's pass count: rounds of passes
        argv = run_argv(pair.model, {}, **_options(pair, args), timeout=budget,
                        num_runs=args.rounds if pair.generator else None, probe=True, output=folder)
        self.taker = Taker.spawn(argv, dict(os.environ), None, args.rounds, context=pair, flag="--rounds")
        if not self.taker.wait_ready(PREPARE_TIMEOUT_S):
            record = self.stop()
            raise ToolError(f"the harness's process ended before measuring: {record['status']}: {record['reason']}")

    def round(self) -> None:
        from aio_examples.drivers.launcher import ROUND_TIMEOUT_S

        if not self.taker.turn(ROUND_TIMEOUT_S + self.seconds, self.seconds, keep=True):
            raise ToolError(f"the harness's process of {self.pair.label} did not answer its round")

    def stop(self) -> dict:
        from aio_examples.core.records import load_records
        from aio_examples.drivers.launcher import STOP_TIMEOUT_S

        outcome = self.taker.stop(STOP_TIMEOUT_S)
        records = [r.to_dict() for r in load_records(self.folder) if r.backend == self.pair.engine] \
            if (self.folder / "results.jsonl").exists() else []
        if not records:
            raise ToolError(f"the harness's process wrote no record (exit {outcome.returncode})")
        return records[-1]


def harness_rounds(record: dict) -> dict:
    """figure -> the harness's ms per round, from its record. A latency's passes split into the rounds by the pass
    counts its probe kept (`probe.rounds`); a generator's TTFT and TPOT per pass are kept as percentiles only, and
    with one pass per round their p50 is already the median over the rounds."""
    generation = (record.get("metrics") or {}).get("generation")
    if generation:
        return {"prefill": [generation["ttft_ms"]["p50"]], "decode": [generation["tpot_ms"]["p50"]]}
    samples, medians = record["samples_ms"], []
    for passes, *_ in record["probe"]["rounds"]:
        medians.append(statistics.median(samples[:passes]))
        samples = samples[passes:]
    return {"latency": medians}


# --- one pair, taking turns -------------------------------------------------------------------------------------

def measure(pair: Pair, args, out: Path) -> list[dict]:
    """The rows of one pair (one per figure); a pair that cannot run gives one row saying why."""
    from aio_examples.machine.contention import CONTENDED_CORES
    from aio_examples.measurement.timing import ROUND_GAP_S, wait_quiet

    folder = out / pair.label.replace(" ", "-").replace("(", "").replace(")", "")
    row = {"pair": pair, "figure": "-", "harness": None, "tool": None, "tool_name": TOOLS[pair.engine].name,
           "others": None, "note": ""}
    print(f"\n== {pair.label} ({row['tool_name']})", flush=True)
    try:
        found = locate(pair, args, folder / "locate")
        if found["status"] != "ok":
            return [{**row, "note": f"{found['status']}: {found['reason']}"}]
        tool = TOOLS[pair.engine](found, args.threads, args.round_s, folder)
        harness = Harness(pair, args, folder / "harness")
    except ToolError as exc:
        return [{**row, "note": str(exc)}]
    tool_rounds: dict[str, list[float]] = {}          # figure -> the tool's median of each round
    try:
        for i in range(args.rounds):
            steps = ("harness", "tool") if i % 2 == 0 else ("tool", "harness")
            # both sides idle: whatever keeps our cores busy now is other processes'; their bursts pass
            waited = wait_quiet(CONTENDED_CORES, args.quiet_wait)
            said = [f"waited {waited:.0f} s for a quiet moment"] if waited >= 1 else []
            for step in steps:
                if step == "harness":
                    harness.round()
                    continue
                for figure, values in tool.round().items():
                    tool_rounds.setdefault(figure, []).append(statistics.median(values))
                    said.append(f"{FIGURES[figure]} {tool_rounds[figure][-1]:.2f} ms")
                time.sleep(ROUND_GAP_S)          # ORT's and OpenVINO's threads spin a while after their last pass
            print(f"round {i + 1:2d} ({' then '.join(steps)}): {tool.name}: {', '.join(said)}", flush=True)
    except ToolError as exc:
        harness.stop()
        return [{**row, "note": str(exc)}]
    finally:
        if hasattr(tool, "close"):      # a tool in a process of its own
            tool.close()
    record = harness.stop()
    if record["status"] != "ok":
        return [{**row, "note": f"harness {record['status']}: {record['reason']}"}]
    artefact = {k: v for k, v in record["backend_info"].items() if k in ("ir", "onnx_path", "file")}
    expected = {k: v for k, v in found["backend_info"].items() if k in artefact}
    if artefact != expected:
        return [{**row, "note": f"the harness ran {artefact}, the tool {expected}"}]
    others = (record.get("contention") or {}).get("busy_elsewhere_cores")
    rows = []
    for figure, mine in harness_rounds(record).items():
        theirs = tool_rounds[figure]
        if len(mine) == len(theirs):         # each harness round beside the tool round next to it in time
            print(f"{FIGURES[figure]}, harness / tool by round: "
                  f"{', '.join(f'{a / b:.3f}' for a, b in zip(mine, theirs, strict=True))}", flush=True)
        rows.append({**row, "figure": figure, "harness": statistics.median(mine),
                     "tool": statistics.median(theirs), "others": others})
    return rows


def verdict(row: dict, tolerance: float) -> str:
    if row["harness"] is None:
        return "n/a"
    off = row["harness"] / row["tool"] - 1
    return f"within {tolerance:.0%}" if abs(off) <= tolerance else f"OFF by {off:+.1%}"


def table(rows: list[dict], tolerance: float) -> str:
    lines = ["| pair | figure | harness ms | tool | tool ms | harness / tool | others' cores | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        measured = r["harness"] is not None
        note = f" ({r['note']})" if r["note"] else ""
        cells = ([f"{r['harness']:.2f}", r["tool_name"], f"{r['tool']:.2f}", f"{r['harness'] / r['tool']:.3f}",
                  "-" if r["others"] is None else f"{r['others']:.2f}"]
                 if measured else ["-", r["tool_name"], "-", "-", "-"])
        lines.append(f"| {r['pair'].label} | {FIGURES.get(r['figure'], '-')} | {' | '.join(cells)} | "
                     f"{verdict(r, tolerance)}{note} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default=",".join(TOOLS), help=f"engines to pair with their tools ({', '.join(TOOLS)})")
    ap.add_argument("--precisions", default=None, help="only these precisions (default: each pair's)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--round-s", type=float, default=5.0, help="seconds each side measures per round")
    ap.add_argument("--quiet-wait", type=float, default=30.0,
                    help="longest wait before a round for other processes to leave our cores alone (s)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--output", default="results/agreement")
    args = ap.parse_args()
    # the harness's processes (`python -m aio_examples`) import the package from this checkout too
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    engines = args.pairs.split(",")
    unknown = [e for e in engines if e not in TOOLS]
    if unknown:
        ap.error(f"--pairs {','.join(unknown)} is invalid; accepted: {', '.join(TOOLS)}")
    precisions = args.precisions.split(",") if args.precisions else None
    pairs = [p for p in PAIRS if p.engine in engines and (precisions is None or p.precision in precisions)]
    out = Path(args.output).absolute()
    start = time.perf_counter()
    rows = [row for pair in pairs for row in measure(pair, args, out)]
    print(f"\n{args.rounds} rounds of {args.round_s:g} s (a generation pass and one llama-bench repetition each), "
          f"{args.threads} threads, batch 1, {(time.perf_counter() - start) / 60:.0f} min:\n")
    print(table(rows, args.tolerance))
    off = [r for r in rows if verdict(r, args.tolerance).startswith("OFF")]
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
