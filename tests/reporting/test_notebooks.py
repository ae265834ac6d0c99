"""Every notebook runs top to bottom, headless, with small settings, and draws its figures."""

import nbformat
import pytest
from conftest import ROOT

nbclient = pytest.importorskip("nbclient")

SMALL_LLAMA = ["num_hidden_layers=2", "hidden_size=256", "intermediate_size=512", "num_attention_heads=8",
               "num_key_value_heads=2", "head_dim=32", "vocab_size=2048"]
SMALL_BERT = ["num_hidden_layers=2", "hidden_size=128", "intermediate_size=256", "num_attention_heads=2"]
SMALL_GPT2 = ["n_layer=2", "n_embd=128", "n_head=2"]
FIVE = ["aio", "eager", "inductor", "onnxruntime", "openvino"]
SMALL = {      # every backend, at shapes small enough for a few minutes a notebook on 2 cores
    "classification/examples.ipynb": f'MODELS = ["squeezenet"]\nBACKENDS = {FIVE}\nTIMEOUT = 0.5\n'
                                     'INPUT_SIZE = 64\nTHREADS = 1\nWEIGHTS = None',
    "object_detection/examples.ipynb": f'MODEL = "ssdlite320_mobilenet_v3"\nBACKENDS = {FIVE}\nTIMEOUT = 0.5\n'
                                       'INPUT_SIZE = 128\nTHREADS = 1\nWEIGHTS = None\nBOXES = 3',
    "nlp/examples.ipynb": f'QA_MODEL = "bert_base"\nQA_CONFIG = {SMALL_BERT}\nGEN_MODEL = "gpt2"\n'
                          f'GEN_CONFIG = {SMALL_GPT2}\nBACKENDS = {FIVE}\nTIMEOUT = 0.5\nSEQ_LEN = 32\n'
                          'NEW_TOKENS = 4\nTHREADS = 1\nMODEL_DIR = None\nLLM = "llama_3_2_1b"\n'
                          f'LLM_CONFIG = {SMALL_LLAMA}\nLLM_BACKENDS = {FIVE}\nLLM_PRECISIONS = ["int4"]',
}
# The models each notebook measures (None: its results table has no model column) on every backend.
MODELS = {"classification/examples.ipynb": ["squeezenet"], "object_detection/examples.ipynb": [None],
          "nlp/examples.ipynb": ["bert_base", "gpt2"]}


def execute(path, parameters: str | None, env_results=None):
    nb = nbformat.read(ROOT / path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "committed with outputs"
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "one cell tagged 'parameters'"
    if parameters is not None:
        params[0].source = parameters
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str((ROOT / path).parent)}})
    client.execute()
    return nb


def images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def table_rows(nb) -> list[dict]:
    """The rows of every DataFrame shown with a backend column, as {column: word}; the leading columns (model,
    backend, precision, status) have one-word names and values, so they line up."""
    rows = []
    frames = [o["data"] for c in nb.cells for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
    for data in frames:
        header = None
        for line in data.get("text/plain", "").splitlines():
            words = line.split()
            if words and not words[0].isdigit():            # a header (a wide frame wraps into blocks)
                header = words if "backend" in words else None
            elif words and header:
                rows.append(dict(zip(header, words[1:])))
    return rows


def listed(rows, model: str | None) -> set[str]:
    """The backends with a row (results or not run) for `model` (for None: any row)."""
    return {r["backend"] for r in rows if model is None or r.get("model") == model}


@pytest.mark.slow          # half a minute to four minutes each: the second tier (the dashboard runs in the first)
@pytest.mark.parametrize("path", sorted(SMALL))
def test_example_notebook_runs_and_draws(path):
    nb = execute(path, SMALL[path])
    assert images(nb) >= 3      # picture (vision) or speeds (nlp), the chart, the profile; nlp also decode vs roofline
    rows = table_rows(nb)
    for model in MODELS[path]:  # every backend has a row: in the results, or not run with its reason
        assert listed(rows, model) == set(FIVE), (model, rows)
    profiled = [c for c in nb.cells if c.cell_type == "code" and "profile=True" in c.source]
    assert len(profiled) == 1 and any("image/png" in o.get("data", {}) for o in profiled[0].outputs)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "Random weights" in text or "random weights" in text          # said plainly
    if path.startswith("nlp"):
        # the engines that cannot generate say so, for GPT-2 and the Llama
        for model, precision in (("gpt2", "fp32"), ("llama_3_2_1b", "int4")):
            for backend in ("onnxruntime", "openvino"):
                row = {"model": model, "backend": backend, "precision": precision, "status": "unsupported"}
                assert any(row.items() <= r.items() for r in rows), (row, rows)
        assert {r["backend"] for r in rows if r.get("precision") == "int4"} == set(FIVE)   # the Llama's, ok or not
        # the generation table: per-token figures
        table = "".join(o.get("data", {}).get("text/plain", "") for c in nb.cells if c.cell_type == "code"
                        for o in c.outputs)
        assert "ttft_p50_ms" in table and "decode_tokens_per_s" in table


def test_dashboard_runs_on_a_results_folder(small_sweep, monkeypatch):
    out, _ = small_sweep
    monkeypatch.setenv("AIO_RESULTS", str(out))        # the kernel inherits it; the parameter cell reads it
    monkeypatch.setenv("AIO_INCLUDE_CONTENDED", "1")   # whatever else the machine runs meanwhile
    nb = execute("notebooks/dashboard.ipynb", None)
    assert images(nb) >= 2                              # suite view and latency vs threads
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "4 records, 4 configurations" in text
