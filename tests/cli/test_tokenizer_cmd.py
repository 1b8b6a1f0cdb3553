"""`fd tokenizer ...` through Typer's CliRunner, checked against transformers and the Tokenizer class."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fdcli.main import app
from fdcli_engine.config import default_model_path
from fdcli_engine.tokenizer import Tokenizer

TEXTS = ["Hello world", "x = [1, 22, 333]  # 🤗 日本語\n\tend", "[bold]not markup[/bold]"]
runner = CliRunner()


def fd(*args: str, input: str | None = None):
    return runner.invoke(app, ["tokenizer", *args], input=input)


@pytest.fixture(scope="module")
def ref():
    transformers = pytest.importorskip("transformers")
    p = default_model_path()
    return transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A byte-level BPE folder whose post-processor adds <s>, to see --no-special act."""
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = HFTok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["hello tiny world"] * 10, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    folder = tmp_path_factory.mktemp("tiny")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return folder


def _assert_one_line_error(result, code=2):
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.output


def test_encode_matches_transformers(ref):
    for text in TEXTS:
        result = fd("encode", text)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == ref.encode(text)


def test_encode_json(ref):
    result = fd("encode", "--json", TEXTS[1])
    data = json.loads(result.stdout)
    assert data["ids"] == ref.encode(TEXTS[1]) and data["count"] == len(data["ids"])
    assert data["tokens"] == ref.convert_ids_to_tokens(data["ids"])


def test_encode_no_special_and_stdin(tiny):
    with_bos = json.loads(fd("encode", "hello", "--tokenizer", str(tiny)).stdout)
    without = json.loads(fd("encode", "hello", "--no-special", "--tokenizer", str(tiny)).stdout)
    assert with_bos == [0, *without] and without
    assert json.loads(fd("encode", "-", "--tokenizer", str(tiny), input="hello").stdout) == with_bos


def test_encode_show_marks_tokens():
    result = fd("encode", "--show", "Hi 🤗 [b]x[/b]")
    assert result.exit_code == 0
    ids = Tokenizer.from_model(default_model_path()).encode("Hi 🤗 [b]x[/b]")
    assert f"{len(ids)} tokens" in result.stdout
    assert "[b]x[/b]" in result.stdout  # printed verbatim, not as Rich markup
    assert "<F0 9F>" in result.stdout or "<20 F0 9F>" in result.stdout  # a partial emoji shows as bytes


@pytest.mark.parametrize("form", [["19556", "905"], ["19556,905"], ["[19556, 905]"], ["[19556,", "905]"]])
def test_decode_forms(form, ref):
    result = fd("decode", *form)
    assert result.exit_code == 0, result.output
    assert result.stdout == ref.decode([19556, 905]) + "\n"


def test_decode_round_trip_and_special_tokens():
    tok = Tokenizer.from_model(default_model_path())
    text = "<|im_start|>user\nÜnïcode 🤗 ok<|im_end|>"
    ids = ",".join(map(str, tok.encode(text)))
    assert fd("decode", ids, "--keep-special").stdout == text + "\n"
    assert fd("decode", ids).stdout == "user\nÜnïcode 🤗 ok\n"
    data = json.loads(fd("decode", "--json", "1", "2").stdout)
    assert data == {"text": "", "tokens": ["<|im_start|>", "<|im_end|>"]}


@pytest.mark.parametrize("bad", [["1", "x"], ["1.5"], ["__import__('os')"], ["[]"], ["-3"], ["49152"]])
def test_decode_bad_ids(bad):
    _assert_one_line_error(fd("decode", *bad))


def test_count(ref):
    text = TEXTS[1]
    assert fd("count", text).stdout == f"{len(ref.encode(text))}\n"
    assert fd("count", "-", input=text).stdout == f"{len(ref.encode(text))}\n"


def test_info_json():
    data = json.loads(fd("info", "--json").stdout)
    assert data["vocab_size"] == 49152 and data["eos_token_ids"] == [2] and data["bos_token_id"] == 1
    assert data["has_chat_template"] is True and data["special_tokens"]["2"] == "<|im_end|>"
    table = fd("info")
    assert table.exit_code == 0 and "49152" in table.stdout and "<|im_end|>" in table.stdout


def test_vocab_export(tmp_path, ref):
    out = tmp_path / "vocab.json"
    result = fd("vocab-export", str(out))
    assert result.exit_code == 0
    vocab = json.loads(out.read_text())
    assert vocab == ref.get_vocab() and len(vocab) == 49152
    assert list(vocab.values()) == sorted(vocab.values())  # ordered by id
    _assert_one_line_error(fd("vocab-export", str(tmp_path / "no" / "dir.json")))


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi [there]"}]


def test_chat_template_matches_transformers(tmp_path, ref):
    f = tmp_path / "m.json"
    f.write_text(json.dumps(MESSAGES))
    expected = ref.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert fd("chat-template", str(f)).stdout == expected  # the template ends with a newline already
    no_gen = ref.apply_chat_template(MESSAGES, add_generation_prompt=False, tokenize=False)
    assert (
        fd("chat-template", "--no-generation-prompt", input=json.dumps({"messages": MESSAGES})).stdout
        == no_gen
    )


def test_chat_template_kwargs_and_custom_template(tmp_path):
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{{ messages | length }}:{{ enable_thinking }}:{{ tools[0].name }}")
    payload = json.dumps({"messages": MESSAGES, "tools": [{"name": "calc"}]})
    result = fd(
        "chat-template", "--template", str(tpl), "--kwargs", '{"enable_thinking": false}', input=payload
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "2:False:calc\n"


@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (["chat-template"], "not json"),
        (["chat-template", "--kwargs", "[1]"], json.dumps(MESSAGES)),
        (["chat-template", "--kwargs", "{bad"], json.dumps(MESSAGES)),
        (["chat-template"], json.dumps([{"content": "no role"}])),
        (["chat-template", "/no/such/file.json"], None),
    ],
)
def test_chat_template_bad_input(args, stdin):
    _assert_one_line_error(fd(*args, input=stdin))


def test_chat_template_missing_is_clear(tiny):
    result = fd("chat-template", "--tokenizer", str(tiny), input=json.dumps(MESSAGES))
    _assert_one_line_error(result)
    assert "no chat template" in result.stderr


def test_missing_model_is_one_line(tmp_path):
    _assert_one_line_error(fd("info", "--model", str(tmp_path / "nope.gguf")))
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file")
    _assert_one_line_error(fd("info", "--model", str(tmp_path / "junk.gguf")), code=1)


def test_save_pretrained_folder_loads_as_the_gguf_tokenizer(tmp_path, ref):
    """The GGUF model's tokenizer written as an HF folder: transformers' AutoTokenizer on that folder and
    fd's own loader give the ids, specials and chat prompt transformers reads from the GGUF itself."""
    import transformers

    out = tmp_path / "tok"
    r = fd("save-pretrained", str(out))
    assert r.exit_code == 0, r.output
    assert "tokenizer.json" in r.output
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    mine = Tokenizer.from_model(out)
    for text in [*TEXTS, "<|im_start|>user\nhi<|im_end|>"]:
        want = ref(text)["input_ids"]
        assert hf(text)["input_ids"] == want
        assert mine.encode(text) == want
    assert (hf.bos_token, hf.eos_token) == (ref.bos_token, ref.eos_token)
    assert mine.eos_token_ids == {ref.eos_token_id}
    messages = [{"role": "user", "content": "What is 2+2?"}]
    want = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == want
    assert mine.apply_chat_template(messages) == want


def test_save_pretrained_keeps_every_eos_id(tmp_path):
    """Extra eos ids (a GGUF's eot token, generation_config's list) survive the round trip."""
    from fdcli_engine.tokenizer import load_tokenizer

    tok = load_tokenizer(str(default_model_path()))
    tok.eos_token_ids = tok.eos_token_ids | {1}
    tok.save_pretrained(tmp_path)
    assert Tokenizer.from_model(tmp_path).eos_token_ids == tok.eos_token_ids
    assert Tokenizer.from_model(tmp_path).eos_token_id == tok.eos_token_id


def test_save_pretrained_unwritable_folder_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = fd("save-pretrained", str(blocker / "sub"))
    assert r.exit_code != 0
    assert "cannot create" in r.output and "Traceback" not in r.output
