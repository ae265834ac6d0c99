"""The model zoo: one registry entry per model."""

import os

from ..core.registry import lookup
from .base import GENERATION_TASKS, ModelSpec, file_sha256, is_generator, load_state_dict_file
from .diffusion import SD15_UNET, UNet
from .nlp import CausalLM, Encoder, Seq2Seq
from .recommendation import Recommender
from .speech import Whisper
from .vision import Classifier, Detector
from .yolo import Yolo

_GENERATION_JIT = "generation passes a growing KV cache between steps, which a trace cannot capture"

ZOO: dict[str, ModelSpec] = {spec.name: spec for spec in (
    # classification (torchvision)
    Classifier("resnet_50_v1", "image-classification", "images", {"input_size": 224}, builder="resnet50",
               weights_name="IMAGENET1K_V1"),
    Classifier("resnet_18", "image-classification", "images", {"input_size": 224}, builder="resnet18"),
    Classifier("mobilenet_v2", "image-classification", "images", {"input_size": 224}, builder="mobilenet_v2"),
    Classifier("mobilenet_v3_large", "image-classification", "images", {"input_size": 224},
               builder="mobilenet_v3_large"),
    Classifier("densenet_121", "image-classification", "images", {"input_size": 224}, builder="densenet121"),
    Classifier("vgg_16", "image-classification", "images", {"input_size": 224}, builder="vgg16"),
    Classifier("inception_v3", "image-classification", "images", {"input_size": 299}, builder="inception_v3",
               builder_kwargs={"aux_logits": True, "init_weights": False}, min_size=75),
    Classifier("squeezenet", "image-classification", "images", {"input_size": 224}, builder="squeezenet1_1"),
    Classifier("efficientnet_b0", "image-classification", "images", {"input_size": 224}, builder="efficientnet_b0"),
    Classifier("vit_b_16", "image-classification", "images", {"input_size": 224}, builder="vit_b_16", min_size=224),
    # object detection (torchvision)
    Detector("ssdlite320_mobilenet_v3", "object-detection", "images", {"input_size": 320},
             builder="ssdlite320_mobilenet_v3_large"),
    Detector("fasterrcnn_mobilenet_v3_fpn", "object-detection", "images", {"input_size": 320},
             builder="fasterrcnn_mobilenet_v3_large_320_fpn"),
    Detector("retinanet_resnet50_fpn", "object-detection", "images", {"input_size": 512},
             builder="retinanet_resnet50_fpn"),
    # object detection (Ultralytics YOLOv8 from its model YAML; NMS is post-processing, outside the timed pass)
    Yolo("yolo_v8n", "object-detection", "images", {"input_size": 640}, config="yolov8n.yaml"),
    Yolo("yolo_v8s", "object-detection", "images", {"input_size": 640}, config="yolov8s.yaml"),
    # NLP (transformers)
    Encoder("bert_base", "question-answering", "sequences", {"seq_len": 384},
            config_class="BertConfig", model_class="BertForQuestionAnswering",
            auto_class="AutoModelForQuestionAnswering"),
    Encoder("distilbert_base", "text-classification", "sequences", {"seq_len": 128},
            config_class="DistilBertConfig", model_class="DistilBertForSequenceClassification",
            auto_class="AutoModelForSequenceClassification"),
    Encoder("roberta_base", "fill-mask", "sequences", {"seq_len": 128},
            config_class="RobertaConfig", model_class="RobertaForMaskedLM", auto_class="AutoModelForMaskedLM",
            config_kwargs=(("max_position_embeddings", 514), ("type_vocab_size", 1), ("layer_norm_eps", 1e-5))),
    CausalLM("gpt2", "text-generation", "tokens", {"seq_len": 32, "new_tokens": 32},
             config_class="GPT2Config", model_class="GPT2LMHeadModel", auto_class="AutoModelForCausalLM",
             unsupported_backends={"torchscript": _GENERATION_JIT}),
    # Llama 3.2 1B's architecture: RMSNorm, RoPE (llama3 scaling), grouped-query attention (32 heads, 8 for
    # keys and values), SwiGLU, tied embeddings; any Llama-architecture folder loads with --model-dir
    CausalLM("llama_3_2_1b", "text-generation", "tokens", {"seq_len": 512, "new_tokens": 128},
             config_class="LlamaConfig", model_class="LlamaForCausalLM", auto_class="AutoModelForCausalLM",
             unsupported_backends={"torchscript": _GENERATION_JIT},
             config_kwargs=(("hidden_size", 2048), ("intermediate_size", 8192), ("num_hidden_layers", 16),
                            ("num_attention_heads", 32), ("num_key_value_heads", 8), ("head_dim", 64),
                            ("vocab_size", 128256), ("max_position_embeddings", 131072), ("rms_norm_eps", 1e-5),
                            ("rope_theta", 500000.0), ("tie_word_embeddings", True),
                            ("rope_scaling", {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
                            ("bos_token_id", 128000), ("eos_token_id", 128001))),
    # facebook/bart-base's architecture (6 + 6 layers, width 768, 12 heads): an article of --seq-len tokens encoded,
    # a summary of --new-tokens decoded (models/nlp.py: Seq2Seq); any BART folder loads with --model-dir
    Seq2Seq("bart_base", "summarization", "tokens", {"seq_len": 512, "new_tokens": 64},
            config_class="BartConfig", model_class="BartForConditionalGeneration",
            auto_class="BartForConditionalGeneration", unsupported_backends={"torchscript": _GENERATION_JIT},
            config_kwargs=(("d_model", 768), ("encoder_layers", 6), ("decoder_layers", 6),
                           ("encoder_attention_heads", 12), ("decoder_attention_heads", 12),
                           ("encoder_ffn_dim", 3072), ("decoder_ffn_dim", 3072), ("vocab_size", 50265),
                           ("max_position_embeddings", 1024))),
    # image generation (diffusers): Stable Diffusion 1.5's UNet, one denoising step of a 64 x 64 latent
    UNet("unet_sd", "image-generation", "steps", {"input_size": 64}, config=SD15_UNET),
    # speech recognition (transformers): Whisper tiny and base, 30 s of audio in, tokens out (models/speech.py);
    # random weights, or a local Whisper folder with --model-dir
    Whisper("whisper_tiny", "speech-recognition", "tokens", {"new_tokens": 64},
            config_class="WhisperConfig", model_class="WhisperForConditionalGeneration",
            auto_class="WhisperForConditionalGeneration", unsupported_backends={"torchscript": _GENERATION_JIT},
            config_kwargs=(("d_model", 384), ("encoder_layers", 4), ("decoder_layers", 4),
                           ("encoder_attention_heads", 6), ("decoder_attention_heads", 6),
                           ("encoder_ffn_dim", 1536), ("decoder_ffn_dim", 1536), ("num_mel_bins", 80),
                           ("max_source_positions", 1500), ("max_target_positions", 448), ("vocab_size", 51865),
                           ("decoder_start_token_id", 50258), ("bos_token_id", 50257), ("eos_token_id", 50257),
                           ("pad_token_id", 50257))),
    Whisper("whisper_base", "speech-recognition", "tokens", {"new_tokens": 64},
            config_class="WhisperConfig", model_class="WhisperForConditionalGeneration",
            auto_class="WhisperForConditionalGeneration", unsupported_backends={"torchscript": _GENERATION_JIT},
            config_kwargs=(("d_model", 512), ("encoder_layers", 6), ("decoder_layers", 6),
                           ("encoder_attention_heads", 8), ("decoder_attention_heads", 8),
                           ("encoder_ffn_dim", 2048), ("decoder_ffn_dim", 2048), ("num_mel_bins", 80),
                           ("max_source_positions", 1500), ("max_target_positions", 448), ("vocab_size", 51865),
                           ("decoder_start_token_id", 50258), ("bos_token_id", 50257), ("eos_token_id", 50257),
                           ("pad_token_id", 50257))),
    # recommendation: MLPerf's DLRM (Criteo 1TB widths, tables capped at 100k rows, DLRMv2's multi-hot lookups)
    Recommender("dlrm", "recommendation", "samples", {}),
)}


def get_model(name: str) -> ModelSpec:
    """A zoo entry by name; or, in its place, the path of a user's model file or Hugging Face folder."""
    if name not in ZOO and os.path.exists(name):
        if os.path.isdir(name):
            from .folders import folder_spec

            return folder_spec(name)
        from .files import FORMATS, file_spec

        if os.path.splitext(name)[1] in FORMATS:
            return file_spec(name)
    return lookup(ZOO, name, "model")


def is_path(name: str) -> bool:
    """Whether a model name given where a zoo name goes is the path of a user's file or folder."""
    return name not in ZOO and os.path.exists(name)


__all__ = ["GENERATION_TASKS", "ZOO", "ModelSpec", "file_sha256", "get_model", "is_generator", "is_path",
           "load_state_dict_file"]
