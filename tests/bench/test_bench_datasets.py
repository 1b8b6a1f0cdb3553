"""Each dataset loader on small fixture files made here."""

import json

import pytest

from fdcli.bench.datasets import DatasetOptions, build_requests
from fdcli_engine.errors import ConfigError


def test_random_prompts_retokenize_to_exact_lengths(bpe_tokenizer):
    opts = DatasetOptions(random_input_len=40, random_output_len=8, random_range_ratio=0.5)
    reqs = build_requests(opts, bpe_tokenizer, 12, seed=0)
    for r in reqs:
        assert len(bpe_tokenizer.encode(r.prompt)) == r.prompt_len
        assert 20 <= r.prompt_len <= 60 and 4 <= r.output_len <= 12
    assert len({r.prompt_len for r in reqs}) > 1  # the range ratio actually varies lengths


def test_random_shared_prefix_is_shared_and_lengths_include_it(bpe_tokenizer):
    opts = DatasetOptions(random_input_len=16, random_output_len=4, random_prefix_len=24)
    reqs = build_requests(opts, bpe_tokenizer, 5, seed=1)
    prefix_text = bpe_tokenizer.decode(bpe_tokenizer.encode(reqs[0].prompt)[:24])
    for r in reqs:
        assert r.prompt_len == 40 == len(bpe_tokenizer.encode(r.prompt))
        assert r.prompt.startswith(prefix_text[:10])


def test_seed_makes_the_request_list_reproducible(bpe_tokenizer):
    opts = DatasetOptions(random_input_len=20)
    a = build_requests(opts, bpe_tokenizer, 4, seed=7)
    assert a == build_requests(opts, bpe_tokenizer, 4, seed=7)
    assert a != build_requests(opts, bpe_tokenizer, 4, seed=8)


def test_random_without_tokenizer_is_a_clear_error():
    with pytest.raises(ConfigError, match="--tokenizer"):
        build_requests(DatasetOptions(), None, 2, seed=0)


def test_prefix_repetition_has_n_prefixes_and_exact_lengths(bpe_tokenizer):
    opts = DatasetOptions(
        name="prefix-repetition",
        prefix_repetition_prefix_len=12,
        prefix_repetition_suffix_len=6,
        prefix_repetition_num_prefixes=3,
        prefix_repetition_output_len=5,
    )
    reqs = build_requests(opts, bpe_tokenizer, 9, seed=2)
    assert all(r.prompt_len == 18 == len(bpe_tokenizer.encode(r.prompt)) for r in reqs)
    assert all(r.output_len == 5 for r in reqs)
    heads = {r.prompt[:8] for r in reqs}
    assert len(heads) == 3


def test_sharegpt_first_turns_and_reply_lengths(tmp_path, word_tokenizer):
    data = [
        {"conversations": [{"from": "human", "value": "a b c"}, {"from": "gpt", "value": "x y"}]},
        {"conversations": [{"from": "human", "value": "only one turn"}]},
        {"conversations": [{"from": "human", "value": "d e"}, {"from": "gpt", "value": "u v w z"}]},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    reqs = build_requests(DatasetOptions(name="sharegpt", path=str(path)), word_tokenizer, 2, seed=0)
    assert sorted((r.prompt, r.prompt_len, r.output_len) for r in reqs) == [("a b c", 3, 2), ("d e", 2, 4)]
    fixed = DatasetOptions(name="sharegpt", path=str(path), sharegpt_output_len=7)
    reqs = build_requests(fixed, None, 3, seed=0)
    assert [r.output_len for r in reqs] == [7, 7, 7] and reqs[0].prompt_len is None


def test_custom_jsonl_with_and_without_output_tokens(tmp_path, word_tokenizer):
    path = tmp_path / "c.jsonl"
    path.write_text('{"prompt": "one two", "output_tokens": 3}\n\n{"prompt": "three"}\n')
    opts = DatasetOptions(name="custom", path=str(path), custom_output_len=9, skip_chat_template=True)
    reqs = build_requests(opts, word_tokenizer, 2, seed=0)
    assert sorted((r.prompt, r.prompt_len, r.output_len) for r in reqs) == [
        ("one two", 2, 3),
        ("three", 1, 9),
    ]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"prompt": "a"}\nnot json\n', ":2: not valid JSON"),
        ('{"text": "a"}\n', ":1: expected"),
        ('{"prompt": "a", "output_tokens": 0}\n', "positive integer"),
    ],
)
def test_custom_bad_lines_name_the_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        build_requests(
            DatasetOptions(name="custom", path=str(path), skip_chat_template=True), None, 1, seed=0
        )


def test_custom_prompts_go_in_the_chat_template_as_vllm_does(tmp_path, word_tokenizer):
    path = tmp_path / "c.jsonl"
    path.write_text('{"prompt": "one two"}\n')
    word_tokenizer.render_chat = lambda msgs: f"<user> {msgs[0]['content']} <assistant>"
    reqs = build_requests(DatasetOptions(name="custom", path=str(path)), word_tokenizer, 1, seed=0)
    assert (reqs[0].prompt, reqs[0].prompt_len) == ("<user> one two <assistant>", 4)
    raw = DatasetOptions(name="custom", path=str(path), skip_chat_template=True)
    assert build_requests(raw, word_tokenizer, 1, seed=0)[0].prompt == "one two"


def test_custom_without_a_chat_template_names_the_flag(tmp_path, word_tokenizer):
    path = tmp_path / "c.jsonl"
    path.write_text('{"prompt": "one two"}\n')
    with pytest.raises(ConfigError, match="has no chat template.*--skip-chat-template"):
        build_requests(DatasetOptions(name="custom", path=str(path)), word_tokenizer, 1, seed=0)


def test_disable_shuffle_keeps_file_order_and_no_oversample_sends_each_once(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(f'{{"prompt": "p{i}"}}\n' for i in range(5)))
    base = dict(name="custom", path=str(path), skip_chat_template=True)
    ordered = build_requests(DatasetOptions(**base, disable_shuffle=True), None, 7, seed=3)
    assert [r.prompt for r in ordered] == ["p0", "p1", "p2", "p3", "p4", "p0", "p1"]
    shuffled = build_requests(DatasetOptions(**base), None, 5, seed=3)
    assert sorted(r.prompt for r in shuffled) == [f"p{i}" for i in range(5)]
    assert [r.prompt for r in shuffled] != [f"p{i}" for i in range(5)]
    once = build_requests(DatasetOptions(**base, no_oversample=True), None, 7, seed=3)
    assert sorted(r.prompt for r in once) == [f"p{i}" for i in range(5)]


def test_prefix_repetition_takes_vllms_spelling(word_tokenizer):
    opts = dict(
        prefix_repetition_prefix_len=3, prefix_repetition_suffix_len=2, prefix_repetition_num_prefixes=1
    )
    vllm = build_requests(DatasetOptions(name="prefix_repetition", **opts), word_tokenizer, 2, seed=0)
    fd = build_requests(DatasetOptions(name="prefix-repetition", **opts), word_tokenizer, 2, seed=0)
    assert [r.prompt for r in vllm] == [r.prompt for r in fd] and vllm[0].prompt_len == 5


def test_missing_dataset_path_and_unknown_dataset():
    with pytest.raises(ConfigError, match="does not exist"):
        build_requests(DatasetOptions(name="custom", path="/nonexistent.jsonl"), None, 1, seed=0)
    with pytest.raises(ConfigError, match="choose one of random"):
        build_requests(DatasetOptions(name="nope"), None, 1, seed=0)


def test_hf_dataset_saved_to_disk(tmp_path, word_tokenizer):
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"question": ["p q", "r s t"], "id": [1, 2]}),
            "test": datasets.Dataset.from_dict({"question": ["only test"], "id": [3]}),
        }
    )
    dd.save_to_disk(str(tmp_path / "ds"))
    opts = DatasetOptions(name="hf", path=str(tmp_path / "ds"), hf_split="test", hf_output_len=4)
    reqs = build_requests(opts, word_tokenizer, 2, seed=0)
    assert [(r.prompt, r.prompt_len, r.output_len) for r in reqs] == [("only test", 2, 4)] * 2
    opts = DatasetOptions(name="hf", path=str(tmp_path / "ds"), hf_prompt_column="id")
    with pytest.raises(ConfigError, match="no usable prompts"):
        build_requests(opts, word_tokenizer, 1, seed=0)
    opts = DatasetOptions(name="hf", path=str(tmp_path / "ds"), hf_prompt_column="nope")
    with pytest.raises(ConfigError, match="columns"):
        build_requests(opts, word_tokenizer, 1, seed=0)


def test_hf_local_json_file_with_chat_column(tmp_path):
    pytest.importorskip("datasets")
    path = tmp_path / "rows.jsonl"
    rows = [{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hello there"}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    opts = DatasetOptions(name="hf", path=str(path), hf_prompt_column="messages")
    (req,) = build_requests(opts, None, 1, seed=0)
    assert req.prompt == "hello there" and req.prompt_len is None
