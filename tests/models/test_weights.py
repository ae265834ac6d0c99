"""Real weight loading: a torchvision state-dict file and a local Hugging Face model folder."""

import pytest
import torch
from conftest import ROOT, run_cli

from aio_examples.core.errors import UsageError
from aio_examples.models import get_model


def _other_resnet18():
    from aio_examples.compat.torchvision_shim import ensure_torchvision

    torch.manual_seed(42)
    return ensure_torchvision().models.resnet18(weights=None).eval()


def test_weights_file_loads_and_changes_outputs(tmp_path):
    saved = _other_resnet18()
    path = tmp_path / "resnet18.pt"
    torch.save(saved.state_dict(), path)
    spec = get_model("resnet_18")
    shape = spec.shape(input_size=64)
    loaded = spec.build(weights=str(path), shape=shape)
    random_init = spec.build(shape=shape)
    x = spec.example_inputs(1, shape, loaded)
    with torch.no_grad():
        assert torch.allclose(loaded(*x), saved(*x))
        assert not torch.allclose(random_init(*x), saved(*x))


def test_weights_file_under_a_state_dict_key(tmp_path):
    saved = _other_resnet18()
    path = tmp_path / "ckpt.pth"
    torch.save({"state_dict": saved.state_dict(), "epoch": 3}, path)
    loaded = get_model("resnet_18").build(weights=str(path))
    assert torch.equal(loaded.fc.weight, saved.fc.weight)


@pytest.mark.parametrize("content", [b"not a checkpoint", None])
def test_bad_weights_are_usage_errors(tmp_path, content):
    path = tmp_path / "bad.pt"
    if content is None:
        torch.save({"fc.weight": torch.zeros(3, 3)}, path)    # a state dict of another model
    else:
        path.write_bytes(content)
    with pytest.raises(UsageError, match="--weights"):
        get_model("resnet_18").build(weights=str(path))


def test_weights_through_run_py_are_recorded(tmp_path):
    path = tmp_path / "resnet18.pt"
    torch.save(_other_resnet18().state_dict(), path)
    out = tmp_path / "res"
    proc = run_cli(["run.py", "--backend", "eager", "--weights", str(path), "--output", str(out),
                    "--input-size", "64", "--num-runs", "3", "-t", "1"], cwd=ROOT / "classification" / "resnet_18")
    assert proc.returncode == 0, proc.stderr
    import json

    record = json.loads((out / "results.jsonl").read_text())
    assert record["weights"] == "file" and str(path) in record["weights_path"] and "sha256" in record["weights_path"]


def make_hf_bert_dir(path):
    """A tiny BERT QA model with its own WordPiece tokenizer, saved the way the hub lays it out."""
    from aio_examples.models.nlp import load_transformers

    tf = load_transformers()
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted({"which", "settings", "decide", "how", "fast", "a", "model", "runs", "on", "cpu", "?", "the", "number", "of", "threads"})
    path.mkdir()
    tokenizer = tf.BertTokenizerFast(vocab={word: i for i, word in enumerate(words)})
    torch.manual_seed(7)
    config = tf.BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=128)
    model = tf.BertForQuestionAnswering(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer


def test_hugging_face_model_dir_loads_model_and_tokenizer(tmp_path):
    saved, tokenizer = make_hf_bert_dir(tmp_path / "tiny-bert")
    spec = get_model("bert_base")
    shape = spec.shape(seq_len=32)
    module = spec.build(model_dir=str(tmp_path / "tiny-bert"), shape=shape)
    ids, mask = spec.example_inputs(2, shape, module)
    assert ids.shape == (2, 32)
    assert ids[0, 0].item() == tokenizer.cls_token_id          # real tokenization, not random ids
    assert (ids != tokenizer.unk_token_id).sum() > 10
    with torch.no_grad():
        start, end = module(ids, mask)
        expected = saved(input_ids=ids, attention_mask=mask)
    assert torch.allclose(start, expected.start_logits) and torch.allclose(end, expected.end_logits)


def test_model_dir_without_config_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no config.json"):
        get_model("bert_base").build(model_dir=str(tmp_path))
