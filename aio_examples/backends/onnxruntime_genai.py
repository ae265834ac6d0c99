"""ONNX Runtime GenAI: its own generation loop over an ONNX model made by its model builder from the weights
the harness built (saved as a Hugging Face folder), fp32 or int4 (MatMulNBits), on the CPU provider."""

import json
import shutil
import subprocess
import sys
import time

from ..core.errors import UnsupportedError
from .artifacts import artifact_dir
from .base import Prepared
from .exports import cached_artifact
from .llm_engines import Engine, EngineBackend, hf_folder, llama_only, one_sequence

# The builder's precisions on CPU; int4: blocks of 32 weights with an fp32 scale (MatMulNBits), and
# accuracy level 4: activations quantized to int8 for the int4 GEMMs, the builder's CPU default
PRECISIONS = {"fp32": "fp32", "int4": "int4"}
INT4_BLOCK, INT4_ACCURACY = 32, 4
MODEL_FILE = "genai_config.json"
# Run in a subprocess with torchvision made loadable first: the builder imports transformers' models
_BUILDER = ("import sys, runpy; from aio_examples.compat.torchvision_shim import ensure_torchvision; "
            "ensure_torchvision(); sys.argv = ['builder'] + sys.argv[1:]; "
            "runpy.run_module('onnxruntime_genai.models.builder', run_name='__main__')")


class OnnxRuntimeGenAIBackend(EngineBackend):
    name = "onnxruntime_genai"
    description = "ONNX Runtime GenAI: its own generation loop, model made by its builder (fp32, int4)"

    package, engine, precisions = "onnxruntime_genai", "ONNX Runtime GenAI", tuple(PRECISIONS)
    install = "pip install onnxruntime-genai"
    precisions_why = "its model builder makes fp32 and int4 models for the CPU"

    def prepare(self, model, example_inputs, precision, threads, ctx):
        import onnxruntime_genai as og

        llama_only(model)
        one_sequence(example_inputs, self.name)
        self.refuse_precision(precision)
        folder, info = _built(model, precision, ctx)
        config = og.Config(str(folder))
        config.clear_providers()        # the CPU provider
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
        start = time.perf_counter()
        loaded = og.Model(config)
        info["load_s"] = round(time.perf_counter() - start, 2)
        data = sum(p.stat().st_size for p in folder.glob("model.onnx*"))
        engine = _Engine(og, loaded, {"weight_bytes": data})
        mode = "native" if precision == "fp32" else f"w4a8-b{INT4_BLOCK}"
        info.update(intra_op_num_threads=threads, provider="cpu")
        return Prepared(engine, example_inputs, mode, info)


def _built(model, precision: str, ctx) -> tuple:
    import onnxruntime_genai as og

    folder = artifact_dir("onnxruntime-genai", ctx.model_name, weights=ctx.weights_id, precision=precision,
                          source=str(next(model.parameters()).dtype), version=og.__version__)
    extra = ["--extra_options", f"int4_block_size={INT4_BLOCK}", f"int4_accuracy_level={INT4_ACCURACY}"] \
        if precision == "int4" else []

    def make(scratch):
        source = hf_folder(model, ctx.model_name, ctx.weights_id)
        start = time.perf_counter()
        run = subprocess.run([sys.executable, "-c", _BUILDER, "-i", str(source), "-o", str(scratch),
                              "-p", PRECISIONS[precision], "-e", "cpu", "-c", str(scratch / ".cache"), *extra],
                             check=False, capture_output=True, text=True)
        if run.returncode:
            last = (run.stderr.strip().splitlines() or ["no message"])[-1]
            raise UnsupportedError(f"ONNX Runtime GenAI's model builder failed: {last[:300]}")
        shutil.rmtree(scratch / ".cache", ignore_errors=True)
        return {"builder": f"onnxruntime_genai.models.builder -p {PRECISIONS[precision]} -e cpu",
                "convert_s": round(time.perf_counter() - start, 2), "folder": str(folder)}

    info, cached = cached_artifact(folder, MODEL_FILE, make)
    # what the built graph runs, read from it each time (cheap: without its weights)
    return folder, {**info, **_what_runs(folder / "model.onnx"), **({"cached": True} if cached else {})}


def _what_runs(path) -> dict:
    """The weight format and KV-cache type as the built graph has them (read without its weights)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    kv = next((i for i in graph.input if i.name.startswith("past_key_values")), None)
    names = {"FLOAT": "fp32", "FLOAT16": "fp16", "BFLOAT16": "bf16"}
    kind = onnx.TensorProto.DataType.Name(kv.type.tensor_type.elem_type) if kv else None
    out = {"kv_cache": names.get(kind, kind)}
    nbits = next((n for n in graph.node if n.op_type == "MatMulNBits"), None)
    if nbits is None:
        out["weights"] = "fp32 MatMul"
        return out
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in nbits.attribute}
    out["weights"] = (f"MatMulNBits: int{attrs.get('bits')} blocks of {attrs.get('block_size')}, "
                      f"accuracy level {attrs.get('accuracy_level')}"
                      + (" (int8 activations)" if attrs.get("accuracy_level") == 4 else ""))
    return out


class _Engine(Engine):
    def __init__(self, og, model, facts):
        super().__init__(facts)
        self.og, self.model = og, model

    def _generator(self, total: int):
        params = self.og.GeneratorParams(self.model)
        # min_length = max_length: exactly the requested tokens, end of sequence ignored
        params.set_search_options(max_length=total, min_length=total, do_sample=False)
        return self.og.Generator(self.model, params)

    def generate(self, prompt, new_tokens):
        import numpy as np
        import torch

        ids = prompt.numpy().astype(np.int32)
        generator = self._generator(ids.shape[1] + new_tokens)
        generator.append_tokens(ids)             # the prefill, and the first token's logits
        first = torch.from_numpy(np.array(generator.get_logits())).reshape(1, -1).float()
        tokens, stamps = [], self.new_stamps()
        while not generator.is_done():
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
            stamps.append(time.perf_counter_ns())
        return torch.tensor([tokens]), first, stamps

    def teacher_forced(self, prompt, tokens, steps):
        import numpy as np
        import torch

        ids = prompt.numpy().astype(np.int32)
        generator = self._generator(ids.shape[1] + steps + 1)
        generator.append_tokens(ids)
        logits = [np.array(generator.get_logits()).reshape(1, -1)]
        for i in range(steps):
            generator.append_tokens(tokens[:, i:i + 1].numpy().astype(np.int32))
            logits.append(np.array(generator.get_logits()).reshape(1, -1))
        return torch.from_numpy(np.stack(logits, 1)).float()
