"""Every zoo model builds and runs one eager pass at a small input."""

import pytest
import torch

from aio_examples.backends import Prepared
from aio_examples.measurement.timing import consume
from aio_examples.models import ZOO, get_model, is_generator

SMALL = {"image-classification": {"input_size": 64}, "object-detection": {"input_size": 128},
         "recommendation": {},         # DLRM's shape is the batch size alone
         "summarization": {"seq_len": 16, "new_tokens": 2}, "image-generation": {"input_size": 16}}
SMALL_SIZES = {"inception_v3": {"input_size": 80}, "vit_b_16": {"input_size": 224}}
# SD 1.5's full UNet (860 M parameters) takes ~10 s to build and 5 s a step at a 16 x 16 latent here: a narrow
# two-block one of the same block types runs in this test, the full one in tests/models/test_diffusion.py (slow)
SMALL_CONFIGS = {"unet_sd": ["block_out_channels=[32,64]", 'down_block_types=["CrossAttnDownBlock2D","DownBlock2D"]',
                             'up_block_types=["UpBlock2D","CrossAttnUpBlock2D"]', "layers_per_block=1",
                             "cross_attention_dim=32"]}
REQUIRED = {"resnet_50_v1", "resnet_18", "mobilenet_v2", "mobilenet_v3_large", "densenet_121", "vgg_16",
            "inception_v3", "squeezenet", "efficientnet_b0", "vit_b_16", "ssdlite320_mobilenet_v3",
            "fasterrcnn_mobilenet_v3_fpn", "retinanet_resnet50_fpn", "bert_base", "distilbert_base",
            "roberta_base", "gpt2", "yolo_v8n", "yolo_v8s"}
FOLDERS = {"image-classification": "classification", "object-detection": "object_detection",
           "speech-recognition": "speech", "recommendation": "recommendation", "image-generation": "image_generation"}


def test_the_zoo_has_every_required_model_with_a_run_py():
    from conftest import ROOT

    assert REQUIRED <= set(ZOO)
    for name, spec in ZOO.items():
        run_py = ROOT / FOLDERS.get(spec.task, "nlp") / name / "run.py"
        assert run_py.is_file(), run_py
        assert f'run_model("{name}")' in run_py.read_text()
    assert ZOO["inception_v3"].default_shape == {"input_size": 299}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "llama_3_2_1b" else n
                                  for n in sorted(ZOO)])   # the 1.2 B-parameter Llama: 20 s, in the slow tier
def test_model_builds_and_runs_one_eager_pass(name):
    spec = ZOO[name].with_config(SMALL_CONFIGS.get(name))
    overrides = SMALL_SIZES.get(name) or SMALL.get(spec.task)
    overrides = overrides if overrides is not None else (
        {"new_tokens": 2} if spec.task == "speech-recognition"       # always 30 s of audio
        else {"seq_len": 8, "new_tokens": 2} if spec.task == "text-generation" else {"seq_len": 16})
    shape = spec.shape(**overrides)
    module = spec.build(shape=shape)
    assert not module.training
    inputs = spec.example_inputs(2, shape, module)
    with torch.no_grad():
        out = spec.make_pass(Prepared(module, inputs, "native"), shape)()
    consume(out)
    if spec.task == "image-classification":
        assert out.shape == (2, 1000)
    elif spec.task == "object-detection":       # YOLO's pass is its network: NMS is post-processing
        detected = spec.postprocess(out)
        assert len(detected) == 2 and {"boxes", "scores", "labels"} <= set(detected[0])
    elif spec.task == "question-answering":
        assert [t.shape for t in out] == [(2, 16), (2, 16)]
    elif spec.task == "recommendation":
        assert out.shape == (2, 1) and ((out > 0) & (out < 1)).all()
    elif spec.task == "image-generation":
        assert out.shape == inputs[0].shape == (2, 4, 16, 16)          # the noise predicted for each latent
    elif is_generator(spec.task):
        tokens, first_logits = out          # generated tokens, and the prompt's next-token logits
        assert tokens.shape == (2, 2) and first_logits.shape == (2, module.model.config.vocab_size)
        assert torch.equal(tokens[:, 0], first_logits.argmax(-1))
    else:
        assert out[0].shape[0] == 2
    assert spec.task_size(2, shape) == (4 if is_generator(spec.task) else 2)


def test_random_weights_are_the_same_in_every_build():
    spec = ZOO["resnet_18"]
    a, b = spec.build(), spec.build()
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet_b0", "vit_b_16"])
def test_random_classifiers_keep_their_signal_at_a_realistic_scale(name):
    """torchvision's initialisation made these outputs 1e-10 (mobilenet_v2), 1e-15 (efficientnet_b0) or exactly
    0 (ViT's zero head) in eval mode: below what fp16 and int8 represent. Rescaled, they are of order 1, and
    the same in every build."""
    import torch

    spec = get_model(name)
    shape = spec.shape(input_size=224 if name == "vit_b_16" else 64)
    first, second = spec.build(shape=shape), spec.build(shape=shape)
    inputs = spec.example_inputs(2, shape, first)
    with torch.no_grad():
        out = first(*inputs)
        assert torch.equal(out, second(*inputs))
    assert 0.1 < float(out.std()) < 10 and spec.random_weights == "random-unit-variance"
