"""The text generators' datasets (text: perplexity, lambada: last-word accuracy) with a real tiny Hugging Face
folder: a word-level tokenizer and a two-layer Llama, loaded through the zoo's spec as `--model-dir` loads them.
Every batch runs through the generation step only at the two shapes a backend prepares."""

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from aio_examples.backends import BACKENDS, PrepareContext
from aio_examples.core.errors import UsageError
from aio_examples.datasets import open_dataset, resolve
from aio_examples.datasets.lambada import Lambada, LastWord
from aio_examples.datasets.text import Text
from aio_examples.machine.threads import ThreadChoice
from aio_examples.measurement import accuracy
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.timing import StopRule
from aio_examples.models import get_model
from aio_examples.models.nlp import graphs_compiled, load_transformers

SHAPE = {"seq_len": 8, "new_tokens": 4}
WORDS = ["the", "a", "cat", "dog", "bird", "sat", "ran", "flew", "on", "over", "under", "mat", "park", "tree", "and",
         "then", "slept", "ate", "fish", "seeds", "near", "river", "house", "old", "young", "small", "big", "quietly",
         "loudly", "morning", "evening", "alpha", "beta"]
PUNCTUATION = [".", ",", "-"]
VOCAB = 2 + len(WORDS) + len(PUNCTUATION)         # [UNK], [EOS], the words, the punctuation
TINY = ["hidden_size=64", "intermediate_size=128", "num_hidden_layers=2", "num_attention_heads=4",
        "num_key_value_heads=2", "head_dim=16"]


def running_text(words: int, seed: int = 7) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), words))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A local Hugging Face folder: a word-level tokenizer over WORDS (tokenizer.json) and a tiny Llama."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tf = load_transformers()
    vocab = {w: i for i, w in enumerate(["[UNK]", "[EOS]", *WORDS, *PUNCTUATION])}
    assert len(vocab) == VOCAB
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = tf.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="[EOS]")
    torch.manual_seed(5)
    config = tf.LlamaConfig(vocab_size=VOCAB, max_position_embeddings=128,
                            **{k: int(v) for k, v in (item.split("=") for item in TINY)})
    root = tmp_path_factory.mktemp("tiny-llama")
    tf.LlamaForCausalLM(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def module(folder):
    return get_model("llama_3_2_1b").build(model_dir=str(folder))


@pytest.fixture()
def text_file(tmp_path):
    path = tmp_path / "wiki.test.raw"
    path.write_text(running_text(53) + "\n")        # 4 windows of 12 tokens, 5 tokens left over
    return path


def score_all(ds, module, batch_size, shape=SHAPE):
    """Every batch through `drive` on the eager step and into a fresh evaluation, as accuracy.score does."""
    spec = get_model("llama_3_2_1b")
    evaluation, outputs = ds.evaluation(spec, module), []
    for batch in ds.batches(spec, batch_size, shape, module):
        out = ds.drive(module, batch.inputs)
        evaluation.add(batch, out)
        outputs.append((batch, out[0]))
    return evaluation, outputs


def test_perplexity_is_teacher_forced_through_the_cache_as_a_full_forward_computes_it(module, text_file):
    ds = open_dataset("text", str(text_file))
    assert Text.needs_tokenizer and ds.tasks == ("text-generation",)
    evaluation, outputs = score_all(ds, module, 3)
    assert [b.count for b, _ in outputs] == [3, 1] and ds.samples == [0, 12, 24, 36]
    ids = torch.tensor(module.tokenizer(text_file.read_text(), add_special_tokens=False)["input_ids"])
    assert len(ids) == 53
    nlls = []
    for batch, nll in outputs:
        assert batch.inputs[0].shape == (3, 12) and nll.shape == (3, 4)       # padded rows driven too
        for (start, tokens), row in zip(batch.targets, nll, strict=False):
            window = ids[start:start + 12]
            assert tokens == window[8:].tolist()
            with torch.no_grad():
                log_probs = torch.log_softmax(module.model(window[None]).logits[0].double(), -1)
            # positions 7..10 predict tokens 8..11: the prefill's logits and then each teacher-forced step's
            expected = -log_probs[torch.arange(7, 11), window[8:]]
            np.testing.assert_allclose(row, expected.numpy(), atol=1e-4)
            nlls += list(row)
    scores = evaluation.metrics()
    assert scores["nll"] == pytest.approx(np.mean(nlls)) and scores["perplexity"] == pytest.approx(math.exp(np.mean(nlls)))
    assert 1 < scores["perplexity"] < 4 * len(module.tokenizer)        # a random model: about the vocabulary's size
    predictions = evaluation.predictions()
    assert [p["window"] for p in predictions] == [0, 1, 2, 3] and predictions[1]["first_token"] == 12
    assert predictions[2]["tokens"] == ids[32:36].tolist() and len(predictions[2]["nll"]) == 4
    json.dumps(predictions)
    # --num-samples counts windows; the digest names the text, not where it lies
    limited = open_dataset("text", str(text_file), num_samples=2)
    assert [b.count for b in limited.batches(get_model("llama_3_2_1b"), 3, SHAPE, module)] == [2]
    assert limited.digest == ds.digest and limited.describe()["kind"] == "text"
    # the timed passes and calibration get the prompts only: the prefill shape
    assert ds.example_inputs(None, 2, SHAPE, module)[0].tolist() == [ids[:8].tolist(), ids[12:20].tolist()]
    assert ds.calibration_inputs(None, 1, SHAPE, module, 2)[1][0].shape == (1, 8)


def greedy(module, context_ids, count):
    """The greedy continuation computed without a cache: the whole sequence again for every token."""
    ids = torch.tensor([context_ids])
    with torch.no_grad():
        for _ in range(count):
            ids = torch.cat([ids, module.model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids[0, len(context_ids):].tolist()


def test_lambada_accuracy_is_the_greedy_continuation_starting_with_the_last_word(module, tmp_path):
    tokenizer = module.tokenizer
    contexts = [running_text(10 + i, seed=i) for i in range(4)]
    # each context's greedy next word, from its last 8 tokens (contexts are left-truncated to --seq-len)
    right = [tokenizer.decode(greedy(module, tokenizer(c, add_special_tokens=False)["input_ids"][-8:], 1))
             for c in contexts]
    wrong = [next(w for w in WORDS if w != r) for r in right]
    passages = [f"{contexts[0]} {right[0]}", f"{contexts[1]} {wrong[1]}", f"{contexts[2]} {right[2]}",
                "the cat sat on the mat",                                # a context of 5 tokens: skipped
                f"{contexts[3]} alpha-beta",                             # a target of 3 tokens
                f"{contexts[3]} a-b-c"]                                  # 5 tokens, more than --new-tokens: skipped
    path = tmp_path / "lambada_test.jsonl"
    path.write_text("".join(json.dumps({"text": p}) + "\n" for p in passages))
    ds = open_dataset("lambada", str(path))
    assert Lambada.needs_tokenizer and [s.target for s in ds.samples] == [right[0], wrong[1], right[2], "mat",
                                                                          "alpha-beta", "a-b-c"]
    evaluation, outputs = score_all(ds, module, 2)
    assert [b.count for b, _ in outputs] == [2, 2]
    assert [o.shape for _, o in outputs] == [(2, 1), (2, 3)]      # decoded as far as the batch's longest target
    multi = greedy(module, tokenizer(contexts[3], add_special_tokens=False)["input_ids"][-8:], 3)
    alpha_beta = multi == tokenizer(" alpha-beta", add_special_tokens=False)["input_ids"]
    assert evaluation.metrics() == {"accuracy": pytest.approx((2 + alpha_beta) / 4)}
    predictions = evaluation.predictions()
    assert [p["line"] for p in predictions] == [1, 2, 3, 4, 5, 6]
    assert [p.get("correct") for p in predictions] == [True, False, True, None, alpha_beta, None]
    assert predictions[1] == {"line": 2, "target": wrong[1], "predicted": right[1], "correct": False}
    assert predictions[3]["skipped"] == "context of 5 tokens, fewer than --seq-len 8"
    assert predictions[5]["skipped"] == "target of 5 tokens, more than --new-tokens 4"
    assert ds.describe()["skipped"] == 2
    # plain text, one passage per line, reads the same passages
    plain = tmp_path / "lambada.txt"
    plain.write_text("\n".join(passages) + "\n\n")
    assert open_dataset("lambada", str(plain)).samples == ds.samples


def test_lambada_compares_every_token_of_a_multi_token_target(module, tmp_path):
    path = tmp_path / "lambada.txt"
    path.write_text("\n".join(f"{running_text(9, seed=i)} alpha-beta" for i in range(4)) + "\n")
    ds = open_dataset("lambada", str(path))
    [batch] = ds.batches(get_model("llama_3_2_1b"), 4, SHAPE, module)
    alpha, dash, beta, cat = (module.tokenizer.convert_tokens_to_ids(t) for t in ("alpha", "-", "beta", "cat"))
    assert [t[2] for t in batch.targets] == [[alpha, dash, beta]] * 4
    evaluation = LastWord(module.tokenizer, ds)
    evaluation.add(batch, [np.array([[alpha, dash, beta, cat], [alpha, dash, cat, beta], [alpha, cat, cat, cat],
                                     [beta, dash, beta, cat]])])
    assert evaluation.metrics() == {"accuracy": 0.25}
    assert [p["predicted"] for p in evaluation.predictions()] == ["alpha - beta", "alpha - cat", "alpha cat cat",
                                                                  "beta - beta"]


def test_scoring_a_compiled_step_compiles_nothing_more(module, text_file, tmp_path):
    """Both datasets drive inductor's step at the two shapes it compiled: no graph is compiled while scoring."""
    spec = get_model("llama_3_2_1b")
    text = open_dataset("text", str(text_file))
    inputs = text.example_inputs(spec, 1, SHAPE, module)
    ctx = PrepareContext(spec.name, spec.task, spec.family, SHAPE, 1, "tiny")
    with torch.no_grad():
        eager = BACKENDS["eager"].prepare(module, inputs, "fp32", 1, ctx)
        compiled = BACKENDS["inductor"].prepare(copy.deepcopy(module), inputs, "fp32", 1, ctx)
        spec.make_pass(compiled, SHAPE)()                  # compiles the prefill and the decode step, as warm-up does
    lambada = tmp_path / "lambada.txt"
    lambada.write_text("\n".join(f"{running_text(12, seed=i)} alpha-beta" for i in range(3)) + "\n")
    for ds in (text, open_dataset("lambada", str(lambada))):
        before = graphs_compiled()
        with torch.no_grad():
            found = accuracy.score(ds, spec, module, compiled, 1, SHAPE)
        assert graphs_compiled() == before, ds.name
        reference = accuracy.score(ds, spec, module, eager, 1, SHAPE)
        assert found[2] == reference[2] == (4 if ds.name == "text" else 3)
        assert found[0] == pytest.approx(reference[0], abs=1e-4)


def test_a_run_scores_perplexity_on_every_backend_without_recompiling(folder, text_file, tmp_path):
    # the folder's own architecture, so the FLOPs the runner counts on random weights are the tiny model's
    spec = get_model("llama_3_2_1b").with_config(TINY + [f"vocab_size={VOCAB}"])
    records = run(RunRequest(spec, ["eager", "inductor"], "fp32", 1, ThreadChoice(1, "--threads"), dict(SHAPE),
                             model_dir=str(folder), rule=StopRule(timeout_s=0.3),
                             dataset=open_dataset("text", str(text_file))), tmp_path)
    assert [r.status for r in records] == ["ok", "ok"], [r.reason for r in records]
    eager, inductor = records
    assert eager.dataset == "text" and eager.accuracy["samples"] == 4
    assert set(eager.accuracy["metrics"]) == {"perplexity", "nll"}
    assert inductor.accuracy["metrics"]["perplexity"] == pytest.approx(eager.accuracy["metrics"]["perplexity"], rel=1e-4)
    assert abs(inductor.accuracy["delta_vs_eager_fp32"]["perplexity"]) < 1e-3
    assert inductor.metrics["generation"]["recompilations"] == 0
    saved = json.loads(Path(inductor.accuracy["predictions"]).read_text())
    assert len(saved) == 4 and len(saved[0]["nll"]) == 4


def test_a_rise_of_perplexity_is_the_loss_the_verdict_bounds():
    def block(perplexity, nll):
        return {"metrics": {"perplexity": 20.0 + perplexity, "nll": 3.0 + nll},
                "reference": {"perplexity": 20.0, "nll": 3.0}, "delta_vs_eager_fp32": {"perplexity": perplexity, "nll": nll}}

    # perplexity and NLL are compared relative to eager fp32's (core/scores.py): fp32 allows 0.5%
    assert accuracy.verdict(block(0.2, 0.001), "fp32") == ("perplexity 20.2 is 1% above eager fp32's 20 on the "
                                                           "same samples (fp32 allows 0.5%)")
    assert accuracy.verdict(block(0.02, 0.03), "fp32").startswith("nll 3.03 is 1% above")
    assert accuracy.verdict(block(0.09, 0.01), "fp32") is None
    assert accuracy.verdict(block(-3.0, -0.1), "bf16") is None              # lower is better: a fall is no loss
    assert accuracy.verdict({"metrics": {"accuracy": 0.5}, "reference": {"accuracy": 0.52},
                             "delta_vs_eager_fp32": {"accuracy": -0.02}}, "bf16").startswith("accuracy 50.0 is 2 pt below")

def test_text_datasets_need_the_model_folder_s_tokenizer(text_file):
    spec = get_model("llama_3_2_1b")
    with pytest.raises(UsageError, match="needs text tokenized as the model was trained"):
        RunRequest(spec, ["eager"], "fp32", 1, ThreadChoice(1, "--threads"), dict(SHAPE),
                   dataset=open_dataset("text", str(text_file)))


@pytest.mark.parametrize(("kind", "content", "message"), [
    ("text", "", "holds no text; accepted: a UTF-8 text file"),
    ("text", " \n\n \t\n", "holds no text"),
    ("text", b"\xff\xfe\x00bad", "cannot be read (UnicodeDecodeError); accepted: a UTF-8 text file"),
    ("lambada", "", "holds no samples; accepted: a LAMBADA file"),
    ("lambada", "\n\n", "holds no samples"),
    ("lambada", '{"text": "the cat sat"}\n["the cat sat"]\n', "line 2 is not an object with a \"text\" string"),
    ("lambada", '{"text": "the cat sat"}\n{"txt": "the cat sat"}\n', "line 2 is not an object with a \"text\""),
    ("lambada", '{"text": "the cat sat"}\n{"text": 3}\n', "line 2 is not an object with a \"text\""),
    ("lambada", '{"text": "the cat sat"}\nthe dog ran\n', "line 2 is not JSON ('the dog ran'); accepted: a LAMBADA"),
    ("lambada", "the cat sat\nsingle\n", "line 2 has no context before its last word ('single')"),
    ("lambada", '{"text": ""}\n', "line 1 has no context before its last word"),
])
def test_malformed_files_are_refused_in_one_line_when_opened(tmp_path, kind, content, message):
    path = tmp_path / "data.txt"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")) as exc:
        open_dataset(kind, str(path))
    assert "\n" not in str(exc.value) and str(path) in str(exc.value)


def test_what_only_the_tokenizer_reveals_is_refused_in_one_line(module, tmp_path):
    spec = get_model("llama_3_2_1b")
    short = tmp_path / "short.txt"
    short.write_text("the cat sat on the mat")
    with pytest.raises(UsageError, match="is 6 tokens long, less than one window of --seq-len \\+ --new-tokens = 12"):
        open_dataset("text", str(short)).example_inputs(spec, 1, SHAPE, module)
    with pytest.raises(UsageError, match="none of its 1 passages has a context of at least --seq-len 8 tokens"):
        open_dataset("lambada", str(short)).example_inputs(spec, 1, SHAPE, module)
    for kind in ("text", "lambada"):
        with pytest.raises(UsageError, match=f"{kind} dataset takes no --labels"):
            open_dataset(kind, str(short), labels=str(short))
        with pytest.raises(UsageError, match=f"{kind} dataset '.*' is not a file"):
            open_dataset(kind, str(tmp_path))
        with pytest.raises(UsageError, match="needs a tokenizer"):
            open_dataset(kind, str(short)).example_inputs(spec, 1, SHAPE, torch.nn.Linear(1, 1))


def test_the_generation_datasets_come_from_their_environment_variables(text_file):
    assert isinstance(resolve("text-generation", environ={"TEXT_DATASET_PATH": str(text_file)}), Text)
    assert isinstance(resolve("text-generation", environ={"LAMBADA_PATH": str(text_file)}), Lambada)
    assert isinstance(resolve("text-generation", "text", environ={"TEXT_DATASET_PATH": str(text_file)}), Text)
    assert resolve("text-generation", environ={"MASKED_TEXT_PATH": str(text_file)}).name == "synthetic"
    with pytest.raises(UsageError, match="dataset 'lambada' is for text-generation, not fill-mask"):
        resolve("fill-mask", f"lambada:{text_file}")
