"""The Python API notebooks and users call: `benchmark(...)`."""

import argparse
import os
import tempfile

from .core.errors import UsageError
from .core.records import Result, check_output_dir, new_run_id
from .drivers.worker import backends_setting, fpmath_setting, launcher_setting, precisions_setting
from .machine.threads import resolve_threads
from .measurement.runner import RunRequest, run
from .measurement.timing import StopRule
from .models import get_model, is_path
from .models.custom import custom_spec, save_module
from .models.files import load_model_file


def benchmark(model, *, precision: str | list[str] = "fp32", backend: str | list[str] = "eager", batch_size: int = 1,
              threads: int | None = None, example_inputs=None, input_size: int | None = None,
              seq_len: int | None = None, new_tokens: int | None = None, weights: str | None = None,
              model_dir: str | None = None, timeout: float = 60.0, num_runs: int | None = None,
              output=None, allow_oversubscribe: bool = False, profile: bool = False,
              config: list[str] | None = None, input_shape: str | None = None,
              input_dtype: str | None = None, launcher: str | None = None,
              tune: str | None = None, fpmath_mode: str | list[str] = "strict") -> Result | list[Result]:
    """Measure a zoo model (by name), your own model file or Hugging Face folder (by path: `.pt2`, `.pt` and
    `.onnx` with `input_shape`/`input_dtype` where the file does not say them, docs/models.md) or your own
    `torch.nn.Module` (with `example_inputs`) on one backend.

    Returns a `Result` (`.to_dict()`, `.to_series()` for a pandas row); with `output`, the record is
    also appended to `<output>/results.jsonl`. With `profile`, a few profiled passes follow the timed ones:
    `result.metrics["profile"]` (docs/profiling.md). `config`: `KEY=VALUE` overrides of a transformers model's
    architecture, as `--config-override` (`["num_hidden_layers=2"]`); they are part of the record's input shape.
    `launcher`: "process" (the default, else `AIO_LAUNCHER`) prepares and measures in a process of its own, so an engine that crashes
    gives a `crashed` record instead of killing the caller (a notebook's kernel), and the memory it used is
    given back when the call returns; "inline" runs in the caller's process (a debugger, a profiler).
    `tune`: aio's tuning where nothing is cached, "quick" (the default) or "thorough" (as `--tune`).
    `fpmath_mode`: fp32's fast math, "strict" (the default), "bf16" or "f16" where this CPU computes it, or a list
    measuring each (as `--fpmath-mode`); the records say the mode asked and read back in `fpmath`.

    `backend`, `precision` and `fpmath_mode` each take a name, a comma list (`"eager,inductor"`, as the CLI), a list
    or `"all"` (backends and precisions). With several backends or precisions, every configuration is measured in one run, in interleaved rounds
    with eager fp32 alongside as the reference of the speedups (as `run --backend a,b`), and the list of their
    records is returned.
    """
    launcher = launcher_setting(launcher)
    if launcher != "inline":        # each configuration's process forks from this server: its imports start now
        from .core.forkserver import prestart

        prestart(dict(os.environ))
    if tune is not None:
        from .backends.aio import TUNE_MODES

        if tune not in TUNE_MODES:
            raise UsageError(f"tune {tune!r} is invalid; accepted: {', '.join(TUNE_MODES)}")
        if launcher == "inline":
            os.environ["AIO_TUNE"] = tune        # aio reads it where it tunes: here
    choice = resolve_threads(threads, allow_oversubscribe=allow_oversubscribe)
    rule = StopRule(timeout_s=timeout, num_runs=num_runs)
    out_dir = check_output_dir(output) if output is not None else None
    inline = launcher == "inline"
    backends, precisions = backends_setting(backend), precisions_setting(precision)     # as the CLI reads them
    pairs = fpmath_setting(fpmath_mode, precisions, inline)
    several = len(backends) * len(pairs) > 1
    # the mode of a run in this process (one at most); with a process per configuration each gets its own
    mode = next((m for _, m in pairs if m != "strict"), "strict") if inline else "strict"
    flags = {"timeout": timeout, "num_runs": num_runs, "threads": threads,
             "allow_oversubscribe": allow_oversubscribe, "profile": profile, "tune": tune}
    if isinstance(model, str) and is_path(model) and not os.path.isdir(model):
        spec, module, inputs, batch, shapes = load_model_file(model, input_shape, input_dtype, try_inputs=inline)
        req = RunRequest(spec, backends, precisions, batch, choice, shapes, model, rule=rule, module=module,
                         example_inputs=inputs, profile=profile, fpmath=mode)
        flags.update(model_file=model, input_shape=input_shape, input_dtype=input_dtype)
    elif isinstance(model, str):
        if is_path(model):              # a Hugging Face folder
            model_dir = model
        spec = get_model(model).with_config(config)
        shape = spec.shape(input_size=input_size, seq_len=seq_len, new_tokens=new_tokens)
        req = RunRequest(spec, backends, precisions, batch_size, choice, shape, weights, model_dir, rule,
                         profile=profile, fpmath=mode)
        flags.update(batch_size=batch_size, input_size=input_size, seq_len=seq_len, new_tokens=new_tokens,
                     weights=weights, model_dir=model_dir, config_override=config)
    else:
        if config:
            raise UsageError(f"config={config!r} applies to a zoo model by name; accepted: none for a built module")
        if example_inputs is None:
            raise TypeError("benchmark(module) needs example_inputs=(tensor, ...)")
        inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
        spec, batch, shapes = custom_spec(model, inputs)
        req = RunRequest(spec, backends, precisions, batch, choice, shapes, rule=rule, module=model,
                         example_inputs=inputs, profile=profile, fpmath=mode)
    results = run(req, out_dir, reference=several) if inline else _in_own_processes(req, model, flags, out_dir,
                                                                                   several, pairs)
    return results if several else results[0]


def _in_own_processes(req: RunRequest, model, flags: dict, out_dir, several: bool, pairs: list) -> list[Result]:
    """The configurations of `req` prepared and measured by `aio-examples run`, each in a process of its own."""
    from .drivers.launcher import Run, configs_of, run_configs
    from .drivers.worker import config_argv

    with tempfile.TemporaryDirectory(prefix="aio-benchmark-") as scratch:
        name = model if isinstance(model, str) and not is_path(model) else None
        if req.module is not None and not flags.get("model_file"):        # a module built here
            flags["saved_module"] = os.path.join(scratch, "module.pt")
            save_module(req.module, req.example_inputs, flags["saved_module"])
        args = argparse.Namespace(**flags)
        configs = configs_of(req.spec, req.backends, req.precisions, req.batch_size, req.shape, reference=several,
                             fpmath_modes=dict.fromkeys(m for _, m in pairs))
        return run_configs(Run(config_argv(name, args), req.spec, req.batch_size, req.threads.threads, req.shape,
                               new_run_id(), req.rule.timeout_s), configs, out_dir)
