"""Every notebook runs top to bottom, headless, with small settings, and draws its figures."""

import nbformat
import pytest
from conftest import ROOT

nbclient = pytest.importorskip("nbclient")

SMALL_LLAMA = ["num_hidden_layers=2", "hidden_size=256", "intermediate_size=512", "num_attention_heads=8",
               "num_key_value_heads=2", "head_dim=32", "vocab_size=2048"]
SMALL = {
    "classification/examples.ipynb": 'MODELS = ["squeezenet"]\nBACKENDS = ["eager", "torchscript"]\nTIMEOUT = 0.5\n'
                                     'INPUT_SIZE = 64\nTHREADS = 1\nWEIGHTS = None',
    "object_detection/examples.ipynb": 'MODEL = "ssdlite320_mobilenet_v3"\nBACKENDS = ["eager"]\nTIMEOUT = 0.5\n'
                                       'INPUT_SIZE = 128\nTHREADS = 1\nWEIGHTS = None\nBOXES = 3',
    "nlp/examples.ipynb": 'QA_MODEL = "bert_base"\nGEN_MODEL = "gpt2"\nBACKENDS = ["eager"]\nTIMEOUT = 0.5\n'
                          'SEQ_LEN = 32\nNEW_TOKENS = 4\nTHREADS = 1\nMODEL_DIR = None\nLLM = "llama_3_2_1b"\n'
                          f'LLM_CONFIG = {SMALL_LLAMA}\nLLM_BACKENDS = ["eager"]\nLLM_PRECISIONS = ["fp32", "int4"]',
}


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


@pytest.mark.slow          # about a minute each: the second tier (the dashboard runs in the first)
@pytest.mark.parametrize("path", sorted(SMALL))
def test_example_notebook_runs_and_draws(path):
    nb = execute(path, SMALL[path])
    assert images(nb) >= 2      # the picture (vision) and the chart; two charts (nlp: speeds, decode vs roofline)
    if path.startswith("classification"):
        assert images(nb) >= 3          # and the profile's category bars
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "Random weights" in text or "random weights" in text          # said plainly
    if path.startswith("nlp"):          # the generation table: per-token figures of each precision
        table = "".join(o.get("data", {}).get("text/plain", "") for c in nb.cells if c.cell_type == "code"
                        for o in c.outputs)
        assert "ttft_p50_ms" in table and "decode_tokens_per_s" in table and "int4" in table


def test_dashboard_runs_on_a_results_folder(small_sweep, monkeypatch):
    out, _ = small_sweep
    monkeypatch.setenv("AIO_RESULTS", str(out))        # the kernel inherits it; the parameter cell reads it
    monkeypatch.setenv("AIO_INCLUDE_CONTENDED", "1")   # whatever else the machine runs meanwhile
    nb = execute("notebooks/dashboard.ipynb", None)
    assert images(nb) >= 2                              # suite view and latency vs threads
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "4 records, 4 configurations" in text
