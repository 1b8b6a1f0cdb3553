"""fdcli_engine.tokenizer against references: transformers' tokenizers, gguf's reader, full decode."""

from __future__ import annotations

import json
import random

import pytest

from fdcli_engine.config import EngineConfig, default_model_path
from fdcli_engine.errors import ConfigError, InvalidRequestError, ModelLoadError
from fdcli_engine.tokenizer import IncrementalDetokenizer, Tokenizer, load_tokenizer
from fdcli_engine.tokenizer.gguf_vocab import read_gguf_metadata

TEXTS = [
    "Hello world",
    "12345 and 3.14159, 2024-01-01; x=1;y=22;z=333",
    " 1 22 333 4444",
    "ünïcödé ñ Straße Ελληνικά кириллица",
    "日本語のテキスト 中文 한국어",
    "emoji 🤗🚀👨‍👩‍👧 done 🇫🇷",
    "   multiple   spaces\n\n\ttabs\r\n  trailing  ",
    "def f(x):\n    return x**2  # comment\n\nclass A:\n\tpass\n",
    "<|im_start|>user\nhi<|im_end|>",
    "I'm it's we'll they've DON'T",
    "",
    " ",
    "a" * 40,
]
TOKENIZER_CLASS = "PreTrainedTokenizerFast"
MESSAGES = [
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye 👋"},
    ],
]


@pytest.fixture(scope="module")
def smol() -> Tokenizer:
    return Tokenizer.from_model(default_model_path())


@pytest.fixture(scope="module")
def smol_ref():
    transformers = pytest.importorskip("transformers")
    p = default_model_path()
    return transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


# --- SmolLM2 GGUF against transformers ------------------------------------------------------------------
def test_gguf_ids_match_transformers(smol, smol_ref):
    for text in TEXTS:
        assert smol.encode(text) == smol_ref.encode(text), text
        assert smol.encode(text, add_special_tokens=False) == smol_ref.encode(text, add_special_tokens=False)


def test_gguf_decode_matches_transformers_and_round_trips(smol, smol_ref):
    for text in TEXTS:
        ids = smol.encode(text)
        assert smol.decode(ids, skip_special_tokens=False) == text  # byte-level BPE is lossless
        assert smol.decode(ids) == smol_ref.decode(ids, skip_special_tokens=True)
        assert smol.convert_ids_to_tokens(ids) == smol_ref.convert_ids_to_tokens(ids)


def test_gguf_smollm_splits_every_digit(smol):
    # smollm's pre-tokenizer isolates each digit; each digit is its own token in this vocabulary.
    assert smol.convert_ids_to_tokens(smol.encode("20240101")) == list("20240101")


def test_gguf_properties(smol, smol_ref):
    assert smol.vocab_size == len(smol_ref) == 49152
    assert smol.bos_token_id == 1 and smol.eos_token_ids == {2} and smol.eos_token == "<|im_end|>"
    assert smol.special_tokens[1] == "<|im_start|>"
    assert smol.encode("hi") == smol.encode("hi", add_special_tokens=False)  # add_bos_token is false


def test_gguf_chat_template_matches_transformers(smol, smol_ref):
    for messages in MESSAGES:
        for gen in (True, False):
            ours = smol.apply_chat_template(messages, add_generation_prompt=gen)
            ref = smol_ref.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
            assert ours == ref


def test_text_parts_are_joined(smol):
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert smol.apply_chat_template(parts) == smol.apply_chat_template([{"role": "user", "content": "a\nb"}])
    # The serving layer hands the template {"type": "image"} stand-ins; a raw image_url part is refused.
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(InvalidRequestError, match="only text and image parts"):
        smol.apply_chat_template(image)


def test_image_parts_reach_the_template_as_a_list():
    from fdcli_engine.tokenizer.chat_template import render_chat_template

    # How Qwen2-VL's template writes an image part (its content loop, trimmed).
    template = (
        "{% for m in messages %}{{ m.role }}:{% if m.content is string %}{{ m.content }}{% else %}"
        "{% for p in m.content %}{% if p.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
        "{% elif p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %};{% endfor %}"
    )
    parts = [
        {"type": "text", "text": "see "},
        {"type": "image"},
        {"type": "text", "text": " and "},
        {"type": "image"},
    ]
    out = render_chat_template(template, [{"role": "user", "content": parts}])
    assert (
        out
        == "user:see <|vision_start|><|image_pad|><|vision_end|> and <|vision_start|><|image_pad|><|vision_end|>;"
    )
    assert (
        render_chat_template(template, [{"role": "user", "content": [{"type": "text", "text": "a"}]}])
        == "user:a;"
    )


def test_decode_rejects_out_of_range_ids(smol):
    with pytest.raises(InvalidRequestError, match="out of range"):
        smol.decode([1, 49152])
    with pytest.raises(InvalidRequestError):
        smol.decode([-1])


# --- chat template sandbox and errors -------------------------------------------------------------------
def test_template_errors_are_invalid_request(smol):
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(InvalidRequestError, match="roles must alternate"):
        smol.apply_chat_template(msgs, chat_template="{{ raise_exception('roles must alternate') }}")
    with pytest.raises(InvalidRequestError, match="syntax error"):
        smol.apply_chat_template(msgs, chat_template="{% for m in messages %}")
    with pytest.raises(InvalidRequestError):  # the sandbox refuses Python internals
        smol.apply_chat_template(msgs, chat_template="{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(InvalidRequestError):  # immutable sandbox: no mutation of the request
        smol.apply_chat_template(msgs, chat_template="{{ messages.append(1) }}")
    with pytest.raises(InvalidRequestError, match="non-empty list"):
        smol.apply_chat_template([])


def test_template_helpers(smol):
    tpl = "{{ tools | tojson }}|{{ strftime_now('%Y') | length }}|{{ bos_token }}|{{ enable_thinking }}"
    out = smol.apply_chat_template(
        [{"role": "user", "content": "x"}], chat_template=tpl, tools=[{"name": "<é>"}], enable_thinking=False
    )
    # tojson keeps <, > and non-ASCII as is (Jinja's builtin would HTML-escape them).
    assert out == '[{"name": "<é>"}]|4|<|im_start|>|False'


def test_no_chat_template_is_a_clear_error(tmp_path):
    folder = _tiny_hf_folder(tmp_path, chat_template=None)
    tok = Tokenizer.from_model(folder)
    with pytest.raises(InvalidRequestError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


# --- incremental detokenizer ----------------------------------------------------------------------------
# One-id decodes shared across every stream of a tokenizer, as the output processor shares them; the key
# holds the tokenizer, so its id is never reused by another one while its cache lives.
_SINGLE_DECODES: dict = {}


def _stream(tok, prompt_ids, output_ids, skip=True, step=1):
    """The deltas of one stream; the same with and without the shared one-id decodes."""
    runs = []
    for cache in (None, _SINGLE_DECODES.setdefault((tok, skip), {})):
        detok = IncrementalDetokenizer(tok, prompt_ids, skip_special_tokens=skip, single_decodes=cache)
        deltas = [detok.add_tokens(output_ids[i : i + step]) for i in range(0, len(output_ids), step)]
        deltas.append(detok.flush())
        runs.append(deltas)
    assert runs[0] == runs[1]
    return runs[1]


def test_single_decodes_hold_each_emitted_id_decoded_alone(smol):
    # The cache is filled by the step-by-step stream and holds exactly the decoder's one-id texts; a
    # stale entry would change every later stream's text, so check the entries themselves.
    cache: dict[int, str] = {}
    ids = smol.encode("héllo 世界 🤗 the world", add_special_tokens=False)
    detok = IncrementalDetokenizer(smol, smol.encode("Say:"), single_decodes=cache)
    text = "".join(detok.add_tokens([t]) for t in ids) + detok.flush()
    assert text == smol.decode(ids)
    assert cache and set(cache) <= set(ids)
    assert all(cache[t] == smol.decode([t]) for t in cache)


def test_incremental_equals_full_decode_on_text(smol):
    prompt = smol.encode("Translate:")
    for text in TEXTS + ["🤗🤗 世界 👨‍👩‍👧", "<|im_end|>tail"]:
        ids = smol.encode(text, add_special_tokens=False)
        for skip in (True, False):
            deltas = _stream(smol, prompt, ids, skip)
            assert "".join(deltas) == smol.decode(ids, skip_special_tokens=skip)
            # No partial character is ever emitted: this text has no U+FFFD at all.
            assert not any("\ufffd" in d for d in deltas)


def test_incremental_ignores_ids_past_the_vocabulary(smol):
    # Models pad their embedding table past the tokenizer's vocabulary; a stream must not fail on those.
    ids = smol.encode("Hello world", add_special_tokens=False)
    assert "".join(_stream(smol, [], [ids[0], smol.vocab_size + 7, ids[1]])) == "Hello world"


def test_incremental_emoji_waits_for_complete_character(smol):
    ids = smol.encode("🤗", add_special_tokens=False)
    assert len(ids) > 1  # the emoji spans several byte-level tokens
    deltas = _stream(smol, [], ids)
    assert deltas[:-2] == [""] * (len(ids) - 1) and deltas[-2] == "🤗" and deltas[-1] == ""


def test_incremental_equals_full_decode_on_random_ids(smol):
    rng = random.Random(0)
    for trial in range(30):
        ids = [rng.randrange(smol.vocab_size) for _ in range(rng.randint(1, 40))]
        prompt = [rng.randrange(smol.vocab_size) for _ in range(rng.randint(0, 8))]
        # A prompt ending inside a character would bleed into the output; real prompts are whole text.
        prompt = smol.encode(smol.decode(prompt), add_special_tokens=False)
        step = 1 + trial % 3
        assert "".join(_stream(smol, prompt, ids, step=step)) == smol.decode(ids), ids


# --- tiny tokenizers built here -------------------------------------------------------------------------
def _tiny_backend():
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = HFTok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<|eot|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [
        "the quick brown fox jumps over the lazy dog",
        "héllo wörld 世界 🤗",
        "def main(): return 42",
    ] * 20
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return tok


def _tiny_hf_folder(
    tmp_path, chat_template="{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
):
    folder = tmp_path / "tiny"
    folder.mkdir()
    _tiny_backend().save(str(folder / "tokenizer.json"))
    cfg = {
        "bos_token": "<s>",
        "eos_token": {"__type": "AddedToken", "content": "</s>", "special": True},
        "model_max_length": 128,
        "tokenizer_class": TOKENIZER_CLASS,
    }
    if chat_template:
        cfg["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))
    return folder


def test_hf_folder_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = _tiny_hf_folder(tmp_path)
    ours = Tokenizer.from_model(folder)
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in ["the lazy fox", "héllo 世界 🤗 42", ""]:
        assert ours.encode(text) == ref.encode(text)
        assert ours.decode(ours.encode(text)) == ref.decode(ref.encode(text), skip_special_tokens=True)
    assert ours.bos_token_id == 0 and ours.eos_token_id == 1 and ours.eos_token_ids == {1, 2}
    assert ours.model_max_length == 128
    msgs = MESSAGES[1]
    assert ours.apply_chat_template(msgs, add_generation_prompt=False) == ref.apply_chat_template(
        msgs, tokenize=False
    )


def test_chat_template_jinja_file_wins(tmp_path):
    folder = _tiny_hf_folder(tmp_path)
    (folder / "chat_template.jinja").write_text("J:{{ messages[0].content }}")
    assert Tokenizer.from_model(folder).apply_chat_template([{"role": "user", "content": "q"}]) == "J:q"


def test_incremental_on_tiny_tokenizer(tmp_path):
    tok = Tokenizer.from_model(_tiny_hf_folder(tmp_path))
    rng = random.Random(1)
    for _ in range(20):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 30))]
        for skip in (True, False):
            assert "".join(_stream(tok, tok.encode("the"), ids, skip)) == tok.decode(
                ids, skip_special_tokens=skip
            )


def _write_tiny_gguf(path, pre: str):
    gguf = pytest.importorskip("gguf")
    from tokenizers import pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokens = ["<s>", "</s>", "<think>", *sorted(alphabet), "12", "123", "Ġt", "he", "Ġthe"]
    merges = ["1 2", "12 3", "Ġ t", "h e", "Ġt he"]
    types = [3, 3, 4] + [1] * (len(tokens) - 3)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("general.tags", ["a", "b"])  # a string array the reader must skip past
    w.add_array("llama.floats", [1.5, 2.5])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(True)
    w.add_chat_template("{{ bos_token }}{{ messages[0].content }}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return tokens


def test_gguf_metadata_reader_matches_gguf_package(tmp_path):
    import gguf

    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(path, "smollm")
    ours = read_gguf_metadata(path, prefixes=("",))
    ref = {k: f.contents() for k, f in gguf.GGUFReader(str(path)).fields.items() if not k.startswith("GGUF.")}
    assert ours.keys() == ref.keys()
    for key, value in ref.items():
        expected = pytest.approx(value) if key == "llama.floats" else value
        assert ours[key] == expected, key


@pytest.mark.parametrize(
    ("pre", "pieces"),
    [
        ("default", ["123", "4", "123"]),  # GPT-2: one run of digits, merged by BPE
        ("llama-bpe", ["123", "4", "12", "3"]),  # digits in groups of three: "123" "412" "3"
        ("qwen2", list("1234123")),  # every digit alone
        ("smollm", list("1234123")),
    ],
)
def test_gguf_pre_tokenizers(tmp_path, pre, pieces):
    path = tmp_path / f"{pre}.gguf"
    tokens = _write_tiny_gguf(path, pre)
    tok = Tokenizer.from_model(path)
    ids = tok.encode("1234123")
    assert ids[0] == 0  # add_bos_token
    assert tok.convert_ids_to_tokens(ids[1:]) == pieces
    assert tok.decode(ids) == "1234123"
    assert tok.vocab_size == len(tokens)
    # Control and user-defined tokens match whole; control ones are skipped on decode.
    assert tok.encode("<think> the</s>", add_special_tokens=False) == [2, tokens.index("Ġthe"), 1]
    assert tok.decode([0, 2, 1]) == "<think>"
    assert tok.apply_chat_template([{"role": "user", "content": "q"}]) == "<s>q"


def test_unsupported_gguf_pre_tokenizer(tmp_path):
    path = tmp_path / "odd.gguf"
    _write_tiny_gguf(path, "no-such-pre")
    with pytest.raises(ModelLoadError, match="no-such-pre"):
        Tokenizer.from_model(path)


def test_load_tokenizer_resolution(tmp_path):
    folder = _tiny_hf_folder(tmp_path)
    assert (
        load_tokenizer(EngineConfig(model=str(default_model_path()), tokenizer=str(folder))).vocab_size < 1000
    )
    assert load_tokenizer(EngineConfig()).vocab_size == 49152  # the default model
    assert load_tokenizer(str(folder)).bos_token_id == 0
    with pytest.raises(ConfigError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        load_tokenizer(tmp_path / "empty")


@pytest.mark.parametrize(("add_bos", "add_eos"), [(False, False), (True, True), (False, True)])
def test_bos_eos_follow_tokenizer_json_like_transformers(tmp_path, add_bos, add_eos):
    transformers = pytest.importorskip("transformers")
    folder = _tiny_hf_folder(tmp_path)  # tokenizer.json's post-processor adds <s>
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.update(add_bos_token=add_bos, add_eos_token=add_eos)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    ours = Tokenizer.from_model(folder)
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = ours.encode("the lazy fox")
    assert ids == ref.encode("the lazy fox")
    assert ids[0] == 0 and ids[-1] != 1  # tokenizer.json's post-processor (adds <s>) wins over the flags


def test_gguf_context_length_is_model_max_length(smol):
    assert smol.model_max_length == 8192  # llama.context_length of SmolLM2-135M-Instruct


# --- SentencePiece GGUF ("llama" tokenizer model) ---------------------------------------------------------
SPM_PIECES = [
    "▁",
    "▁t",
    "he",
    "▁the",
    "▁a",
    "ll",
    "▁h",
    "▁he",
    "llo",
    "▁hello",
    "or",
    "▁w",
    "▁wor",
    "▁world",
    "12",
]
SPM_CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,!?'") + ["é", "世"]


def _write_tiny_spm_gguf(path, add_space_prefix: bool | None = None):
    gguf = pytest.importorskip("gguf")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES + SPM_CHARS
    types = [2, 3, 3] + [6] * 256 + [1] * (len(SPM_PIECES) + len(SPM_CHARS))  # 6: byte-fallback pieces
    scores = (
        [0.0] * 259
        + [-float(i) for i in range(len(SPM_PIECES))]
        + [-100.0 - i for i in range(len(SPM_CHARS))]
    )
    w = gguf.GGUFWriter(str(path), "llama")
    # transformers reads a model config from the file before its tokenizer.
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return tokens


SPM_TEXTS = [
    "hello world",
    " hello  world",
    "the hello",
    "héllo 世界 🤗 ok",
    "12 1 121\nx",
    "",
    "<s>the</s>",
    "a  b",
]


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    path = tmp_path_factory.mktemp("spm") / "tiny-spm.gguf"
    _write_tiny_spm_gguf(path)
    return path


def test_sentencepiece_gguf_matches_transformers(spm):
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(spm.parent), gguf_file=spm.name)
    ours = Tokenizer.from_model(spm)
    assert ours.vocab_size == len(ref)
    for text in SPM_TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text), text
        assert ids[0] == 1  # llama.cpp adds BOS to SentencePiece vocabularies by default
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
        if "<s>" not in text:  # round trip, minus the one leading space SentencePiece decoding strips
            assert ours.decode(ids) == (text[1:] if text.startswith(" ") else text)


def test_sentencepiece_merges_and_byte_fallback(spm):
    tok = Tokenizer.from_model(spm)
    assert tok.convert_ids_to_tokens(tok.encode("the hello", add_special_tokens=False)) == ["▁the", "▁hello"]
    ids = tok.encode("🤗", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == ["▁", "<0xF0>", "<0x9F>", "<0xA4>", "<0x97>"]
    assert b"".join(tok.token_bytes(i) for i in ids) == " 🤗".encode()
    assert tok.decode(ids) == "🤗"


def test_sentencepiece_without_space_prefix(tmp_path):
    path = tmp_path / "nospace.gguf"
    _write_tiny_spm_gguf(path, add_space_prefix=False)
    tok = Tokenizer.from_model(path)
    assert tok.convert_ids_to_tokens(tok.encode("hello world", add_special_tokens=False))[:2] == ["he", "llo"]
    assert tok.decode(tok.encode(" hello")) == " hello"


def test_incremental_on_sentencepiece(spm):
    # A SentencePiece decode strips the text's leading space, so the reference is the output's text in
    # context — decode(prompt + output) past decode(prompt) — which keeps "hello" + " world" spaced.
    tok = Tokenizer.from_model(spm)

    def in_context(prompt, ids):
        return tok.decode(prompt + ids)[len(tok.decode(prompt)) :]

    rng = random.Random(2)
    for _ in range(20):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 30))]
        prompt = tok.encode("the")
        assert "".join(_stream(tok, prompt, ids)) == in_context(prompt, ids)
    text_ids = tok.encode("héllo 世界 🤗 the world", add_special_tokens=False)
    deltas = _stream(tok, tok.encode("hello"), text_ids)
    assert "".join(deltas) == " héllo 世界 🤗 the world" == in_context(tok.encode("hello"), text_ids)
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("repeat", [1, 3, 40, 400])
def test_texts_encode_to_the_ids_of_the_plain_encode(smol, smol_ref, repeat):
    """encode goes through the backend's batch call without offsets (which releases the GIL): the ids
    of transformers' tokenizer and of the backend's plain `encode`, special tokens and all, short or
    long; encode_batch gives each text's ids alike."""
    text = "<|im_start|>user\nThe café costs 12.50€, naïve 東京 🙂 " * repeat
    assert (
        smol.encode(text, add_special_tokens=False) == smol_ref(text, add_special_tokens=False)["input_ids"]
    )
    odd = text + "  x\n\n 42 \t"  # whitespace runs and digits: the pre-tokenizer's edge cases
    for t in (text, odd):
        assert smol.encode(t) == smol.backend.encode(t).ids
        assert (
            smol.encode(t, add_special_tokens=False) == smol.backend.encode(t, add_special_tokens=False).ids
        )
    assert smol.encode_batch([odd, "hi"]) == [smol.backend.encode(t).ids for t in (odd, "hi")]
