"""Whether llama.cpp's extra buffer types run on this CPU, found once in a throwaway process.

ggml's CPU backend places weights it has special kernels for in "extra buffer types": `AMX` (Intel AMX tiles:
Q4_0, Q8_0 and other quantized types, and F16 with AVX-512 kernels) and `CPU_REPACK` (weights repacked for
AVX2/AVX-512 or Arm dot products; Q4_0 here). On some machines (an AMX Xeon in a VM) the AMX kernel's
`tileloadd` raises SIGILL, which kills the process and cannot be caught. So before llama.cpp
loads Q8_0, Q4_0 or F16 weights, a child process loads a tiny GGUF file of that tensor type and generates two
tokens after a 16-token prompt (the prompt's GEMMs take AMX's tile kernels, the decode its VNNI ones). If the
child dies from a signal, a second child tries without extra buffer types; if that runs, llama.cpp loads
that tensor type without them from then on, else the precision is refused. The decision is cached per CPU
(model and ISA flags), kernel, llama-cpp-python version and build (the ggml CPU library's digest) and tensor
type: the probe costs a second or two once.

How they are turned off: `llama_model_params.use_extra_bufts` (llama.h; llama.cpp's own tools call it
`--no-repack`, environment `LLAMA_ARG_NO_REPACK`, read by their argument parser only, not by the library).
llama-cpp-python 0.3.36's `Llama()` has no argument for it (unknown keyword arguments are ignored) and fills
its model parameters from `llama_cpp.llama_model_default_params()` inside the constructor, before it loads
the model; `load` makes that function return the field cleared while the model loads, and checks
`Llama.model_params` afterwards. No environment variable does it: ggml's CPU backend reads none for its extra
buffer types or AMX (`GGML_CPU_TILED_MM` switches the K-quant tiled matmul, which has no AMX), and AMX is
compiled in only when llama.cpp is built for an AMX CPU (`-march=native` there, or `GGML_AMX_INT8`). With
them off, llama.cpp's verbose log lists the weights in plain `CPU_Mapped` buffers only, no `AMX` or
`CPU_REPACK` model buffer.
"""

import argparse
import functools
import hashlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.errors import UnsupportedError
from ..core.paths import cache_dir, write_json_atomic
from ..core.processes import signal_name
from ..machine.environment import capture
from .artifacts import key

PROBED = ("Q8_0", "Q4_0", "F16")      # the tensor types an extra buffer type takes (AMX takes F16 too)
PLAIN_BUFFERS = ("CPU", "CPU_Mapped")   # where weights go without extra buffer types
REVISION = 1            # this probe's own: raised when what it runs changes, so old decisions are made again
TIMEOUT_S = 120
PROMPT_TOKENS, NEW_TOKENS, THREADS = 16, 2, 2   # two threads: a worker thread runs kernels as well as the main one
# Killed from outside (the OOM killer, a user), not by llama.cpp's own code: says nothing about the kernels
_OUTSIDE = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
_BUFFER = re.compile(r"^\S+:\s+(\S+) model buffer size", re.MULTILINE)
_DEFAULTS = threading.Lock()

Command = Callable[[bool], list]     # extra buffer types on/off -> the child's argv
# The child: `main` below (not `-m`: the package imports this module first, and runpy would warn)
_CHILD = "import sys; from aio_examples.backends.llama_cpp_probe import main; main(sys.argv[1:])"


def load(path, extra_buffer_types: bool, **kwargs):
    """`llama_cpp.Llama(model_path=path, **kwargs)`, with or without llama.cpp's extra buffer types."""
    import llama_cpp
    import llama_cpp.llama_cpp as low_level

    with _DEFAULTS:          # held either way: a model loading in another thread would see the swapped function
        if extra_buffer_types:
            return llama_cpp.Llama(model_path=str(path), **kwargs)
        defaults = low_level.llama_model_default_params

        def without_extra_bufts():
            params = defaults()
            params.use_extra_bufts = False
            return params

        low_level.llama_model_default_params = without_extra_bufts
        try:
            llm = llama_cpp.Llama(model_path=str(path), **kwargs)
        finally:
            low_level.llama_model_default_params = defaults
    if llm.model_params.use_extra_bufts:
        raise UnsupportedError("this llama-cpp-python cannot load without extra buffer types (its Llama() no longer "
                               "takes its model parameters from llama_model_default_params)")
    return llm


@dataclass(frozen=True)
class Decision:
    """How llama.cpp loads one tensor type on this machine."""

    extra_buffer_types: bool         # the setting to load with
    reason: str | None = None        # why not the default (on), or why the precision is refused
    unsupported: bool = False        # crashed with and without extra buffer types
    buffer_types: tuple = ()         # the weights' buffer types in the deciding probe (llama.cpp's log)
    probe_s: float | None = None     # seconds of probing in this process (None: read from the cache)

    def info(self) -> dict:
        """For `backend_info`."""
        out = {"extra_buffer_types": self.extra_buffer_types}
        if self.reason:
            out["extra_buffer_types_why"] = self.reason
        if self.buffer_types:
            out["probe_buffer_types"] = list(self.buffer_types)
        if self.probe_s is not None:
            out["probe_s"] = self.probe_s
        return out


@dataclass(frozen=True)
class Probe:
    """How one probe child ended."""

    returncode: int | None           # None: timed out
    buffer_types: tuple
    last_line: str

    @property
    def signal(self) -> str | None:
        """The signal that killed it, when it came from inside (a crash)."""
        if self.returncode is None or -self.returncode in _OUTSIDE:
            return None
        return signal_name(self.returncode)

    @property
    def ran(self) -> bool:
        return self.returncode == 0

    def failure(self) -> str:
        how = "timed out" if self.returncode is None else (
            f"killed by {self.signal or signal.Signals(-self.returncode).name}" if self.returncode < 0
            else f"exit code {self.returncode}")
        return how + (f": {self.last_line[:200]}" if self.last_line else "")


def run_probe(argv: list, timeout_s: float = TIMEOUT_S) -> Probe:
    """Run one probe child; a crash stays in it."""
    try:
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace",
                              timeout=timeout_s, start_new_session=True, check=False)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return Probe(None, (), _last_line(err))
    found = dict.fromkeys(_BUFFER.findall(done.stderr))      # in order, once each
    return Probe(done.returncode, tuple(found), _last_line(done.stderr))


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def decide(tensor_type: str, command: Command, machine: dict) -> Decision:
    """The cached decision for `tensor_type` on `machine` (its CPU and library), else a probe's: `command(True)`
    with extra buffer types, and `command(False)` without them when the first dies from a signal. Only
    conclusive probes (each ran or crashed) are cached: a failure or a timeout says nothing about the kernels,
    and leaves the default."""
    parts = {"tensor_type": tensor_type, "machine": machine, "probe": REVISION}
    path = cache_dir("llama-cpp-probe") / f"{key(**parts)}.json"
    try:
        saved = json.loads(path.read_text())["decision"]
        return Decision(**{**saved, "buffer_types": tuple(saved["buffer_types"])})
    except (OSError, ValueError, KeyError, TypeError):
        pass           # not probed yet (or an unreadable file: probed again)
    start = time.perf_counter()
    decision, conclusive = _probe(tensor_type, command)
    decision = Decision(**{**asdict(decision), "probe_s": round(time.perf_counter() - start, 2)})
    if conclusive:
        saved = {k: v for k, v in asdict(decision).items() if k != "probe_s"}
        write_json_atomic(path, {**parts, "decision": saved}, indent=1, default=str)
    return decision


def _probe(tensor_type: str, command: Command) -> tuple[Decision, bool]:
    with_extra = run_probe(command(True))
    if with_extra.ran:
        return Decision(True, buffer_types=with_extra.buffer_types), True
    crash = with_extra.signal
    if crash is None:
        return Decision(True, f"the probe of llama.cpp's extra buffer types failed ({with_extra.failure()}); left on"), False
    extras = [b for b in with_extra.buffer_types if b not in PLAIN_BUFFERS]    # logged before the crash
    which = "extra buffer types" + (f" ({', '.join(extras)})" if extras else "")
    crashed = f"crashed with {crash} on this CPU in a probe with {tensor_type} weights"
    without = run_probe(command(False))
    if without.ran:
        return Decision(False, f"llama.cpp's {which} {crashed}; disabled", buffer_types=without.buffer_types), True
    if without.signal == crash:
        return Decision(False, f"llama.cpp {crashed}, with and without its {which}", unsupported=True), True
    if without.signal:
        return Decision(False, f"llama.cpp crashed on this CPU in a probe with {tensor_type} weights: {crash} with "
                               f"its {which}, {without.signal} without them", unsupported=True), True
    return Decision(False, f"llama.cpp's {which} {crashed}; disabled (the probe without them failed: "
                           f"{without.failure()})"), False


def decision(tensor_type: str) -> Decision:
    """How llama.cpp loads `tensor_type` on this machine: probed once for the types extra buffer types take."""
    if tensor_type not in PROBED:
        return Decision(True)
    return decide(tensor_type, probe_command(tensor_type), machine())


@functools.lru_cache(maxsize=1)
def machine() -> dict:
    """What the outcome depends on: the CPU, the kernel (AMX needs its permission) and the llama.cpp build."""
    import llama_cpp

    env = capture()
    lib = Path(llama_cpp.__file__).parent / "lib"
    digest = hashlib.sha256()
    for file in sorted(lib.glob("*ggml-cpu*")):      # built for this CPU: a rebuild may add or drop AMX
        digest.update(file.name.encode() + file.read_bytes())
    return {"cpu": env["cpu_model"], "isa": env["isa"], "arch": env["arch"], "kernel": env["kernel"],
            "llama_cpp_python": llama_cpp.__version__, "ggml_cpu": digest.hexdigest()[:20]}


def probe_command(tensor_type: str) -> Command:
    """The real probe: this module run on a tiny GGUF file of `tensor_type` (written on first use)."""
    gguf = functools.cache(lambda: _tiny_gguf(tensor_type))

    def command(extra_buffer_types: bool) -> list:
        return [sys.executable, "-c", _CHILD, str(gguf()),
                "--extra-buffer-types", "on" if extra_buffer_types else "off"]

    return command


def _tiny_gguf(tensor_type: str) -> Path:
    """A one-layer Llama of random weights whose matrix sizes are multiples of AMX's tiles (32 rows and
    columns), so every kernel the type has runs, written like a run's GGUF file."""
    from types import SimpleNamespace

    import torch

    from ..models.nlp import load_transformers
    from .gguf import TENSOR_TYPES, gguf_file

    transformers = load_transformers()
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=512,
                                      max_position_embeddings=64, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):         # the run's own random state is left as it was
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
    precision = {t: p for p, t in TENSOR_TYPES.items()}[tensor_type]
    path, _ = gguf_file(SimpleNamespace(model=model), precision, "llama-cpp-probe", f"random-seed-0-r{REVISION}")
    return path


def main(argv=None) -> None:
    """The probe child: load a GGUF file and generate a few tokens greedily; llama.cpp's log goes to stderr."""
    parser = argparse.ArgumentParser(prog="llama_cpp_probe", description="Load a GGUF file with llama.cpp and generate two tokens.")
    parser.add_argument("gguf")
    parser.add_argument("--extra-buffer-types", choices=("on", "off"), required=True)
    args = parser.parse_args(argv)
    llm = load(args.gguf, args.extra_buffer_types == "on", n_ctx=PROMPT_TOKENS + NEW_TOKENS,
               n_batch=PROMPT_TOKENS, n_ubatch=PROMPT_TOKENS, n_threads=THREADS, n_threads_batch=THREADS,
               verbose=True)
    for count, _ in enumerate(llm.generate(list(range(1, PROMPT_TOKENS + 1)), top_k=1, temp=0.0, reset=True), 1):
        if count == NEW_TOKENS:
            break
