"""Fixtures of tiny real Hugging Face folders the text and speech dataset tests load as `--model-dir` loads them: random
weights whose outputs depend on their inputs, and tokenizers small enough to build in milliseconds."""

import pytest
import torch

from aio_examples.models.nlp import load_transformers

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WHISPER_SPECIALS = ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory):
    """`make(words, head, **config)`: a folder of a tiny BERT with the `head` class (BertForQuestionAnswering...)
    and a WordPiece tokenizer of the special tokens and `words` (padded to 300 entries)."""
    tf = load_transformers()

    def make(words, head: str, **config):
        folder = tmp_path_factory.mktemp(f"tiny-bert-{head}")
        vocab = BERT_SPECIALS + [w for w in words if w not in BERT_SPECIALS]
        vocab += [f"word{i}" for i in range(300 - len(vocab))]
        (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
        torch.manual_seed(3)
        model_config = tf.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=128, **config)
        getattr(tf, head)(model_config).eval().save_pretrained(folder)
        # `vocab=` (transformers 5 ignores `vocab_file=` and would build a tokenizer of the specials only)
        tf.BertTokenizerFast(vocab=str(folder / "vocab.txt")).save_pretrained(folder)
        return folder

    return make


@pytest.fixture(scope="session")
def whisper_folder(tmp_path_factory):
    """A local Whisper folder: config, random weights (large enough that the transcript depends on the audio), a
    byte-level BPE tokenizer (the 256 bytes, end of text and the start-of-transcript tokens; no merges), a default
    feature extractor, and a generation config that names the prompt's tokens and suppresses a few tokens always,
    and end of text and the space at the first step, as real multilingual Whisper folders' do (no spelling map: a
    tiny tokenizer has no normalizer.json)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tf = load_transformers()
    folder = tmp_path_factory.mktemp("tiny-whisper")
    tokenizer = tf.WhisperTokenizer(vocab={c: i for i, c in enumerate(bytes_to_unicode().values())}, merges=[])
    tokenizer.add_special_tokens({"additional_special_tokens": WHISPER_SPECIALS})
    torch.manual_seed(5)
    config = tf.WhisperConfig(vocab_size=len(tokenizer), d_model=32, encoder_layers=1, decoder_layers=1,
                              encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                              decoder_ffn_dim=64, max_source_positions=100, max_target_positions=64,
                              decoder_start_token_id=tokenizer.convert_tokens_to_ids(WHISPER_SPECIALS[0]),
                              bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.eos_token_id, init_std=1.0)
    model = tf.WhisperForConditionalGeneration(config).eval()
    prompt = tokenizer.convert_tokens_to_ids(WHISPER_SPECIALS)
    with torch.no_grad():
        # end of text's embedding row is the padding row (zeros: a logit of 0, never chosen); make it the close rival
        # of the token the model picks first most often, so that transcripts end and sometimes would start empty
        features = torch.rand((8, config.num_mel_bins, 2 * config.max_source_positions)) * 2 - 1
        first = model(input_features=features, decoder_input_ids=torch.tensor([prompt] * 8)).logits[:, -1].argmax(-1)
        embeddings = model.get_output_embeddings().weight
        embeddings[tokenizer.eos_token_id] = 1.05 * embeddings[int(first.mode().values)]
    _, english, transcribe, no_timestamps = prompt
    generation = model.generation_config
    generation.is_multilingual, generation.lang_to_id, generation.task_to_id = True, {"<|en|>": english}, {
        "transcribe": transcribe}
    generation.no_timestamps_token_id = no_timestamps
    generation._from_model_config = False       # else generate rebuilds it from the model's config, without these
    generation.suppress_tokens = [tokenizer.convert_tokens_to_ids(c) for c in "!\"#$%&"]
    generation.begin_suppress_tokens = [tokenizer.convert_tokens_to_ids("Ġ"), tokenizer.eos_token_id]
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    tf.WhisperFeatureExtractor().save_pretrained(folder)
    return folder
