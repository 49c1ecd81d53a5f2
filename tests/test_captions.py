"""Captions of cluttered-digit canvases and the locally trained subword tokenizer (LIMoE data, issue 9)."""

import subprocess
import sys

import numpy as np
import pytest

from moe_course.data.captioned import CaptionedDigits
from moe_course.data.captions import (
    CAPTION_TEMPLATES,
    POSITION_PHRASES,
    PROMPT_TEMPLATES,
    ZERO_SHOT_TEMPLATES,
    attribute_templates,
    caption,
    class_prompts,
    position_phrase,
    size_word,
)
from moe_course.data.tokenizer import PAD_ID, UNK_ID, SubwordTokenizer


@pytest.fixture(scope="module")
def captioned(small_digits):
    return CaptionedDigits(small_digits)


def test_size_word_splits_the_range_in_thirds():
    assert [size_word(s, (14, 22)) for s in range(14, 23)] == ["small"] * 3 + ["medium"] * 3 + ["large"] * 3
    assert size_word(8, (8, 8)) == "small"
    with pytest.raises(ValueError, match="side=23"):
        size_word(23, (14, 22))


def test_position_phrase_names_the_third_of_the_free_room():
    # A 14-pixel digit on 32 pixels has 19 possible offsets 0-18: 0-6 first third, 7-12 second, 13-18 last.
    assert position_phrase(0, 0, 14, 32) == "top left"
    assert position_phrase(0, 9, 14, 32) == "top"
    assert position_phrase(9, 9, 14, 32) == "center"
    assert position_phrase(9, 18, 14, 32) == "right"
    assert position_phrase(18, 18, 14, 32) == "bottom right"
    assert position_phrase(6, 7, 14, 32) == "top"
    assert position_phrase(7, 12, 14, 32) == "center"
    assert position_phrase(13, 6, 14, 32) == "bottom left"
    assert position_phrase(0, 0, 32, 32) == "top left"  # no room: the first third
    with pytest.raises(ValueError, match="does not fit"):
        position_phrase(19, 0, 14, 32)


def test_caption_states_class_size_and_position():
    text = caption("seven", (10, 0, 22, 22), image_size=32, digit_size=(14, 22), template=0)
    assert text == "a large seven in the bottom left"
    texts = {caption("two", (0, 18, 14, 14), image_size=32, digit_size=(14, 22), template=t)
             for t in range(len(CAPTION_TEMPLATES))}
    assert len(texts) == len(CAPTION_TEMPLATES)
    assert all("two" in t and "small" in t and "top right" in t for t in texts)
    with pytest.raises(ValueError, match="template=6"):
        caption("two", (0, 0, 14, 14), image_size=32, digit_size=(14, 22), template=len(CAPTION_TEMPLATES))


def test_class_prompts_name_only_the_class():
    prompts = class_prompts(("zero", "one"))
    assert len(prompts) == 2 and len(prompts[0]) == len(PROMPT_TEMPLATES)
    assert all("one" in p and "zero" not in p for p in prompts[1])
    with pytest.raises(ValueError, match="no \\{name\\} field"):
        class_prompts(("zero",), ("a digit",))


def test_captions_match_the_drawn_canvas(captioned):
    cfg = captioned.digits.config
    batch = captioned.get("val", np.arange(12))
    for text, label, box in zip(batch["caption"], batch["label"], batch["box"]):
        assert captioned.class_names[label] in text
        assert size_word(int(box[2]), cfg.digit_size) in text
        assert position_phrase(int(box[0]), int(box[1]), int(box[2]), cfg.image_size) in text


def test_captions_deterministic_fresh_per_train_epoch_fixed_for_eval(small_digits, captioned):
    again = CaptionedDigits(small_digits)
    idx = np.arange(captioned.split_size("train"))
    a = captioned.get("train", idx, epoch=2)
    b = again.get("train", idx, epoch=2)
    np.testing.assert_array_equal(a["caption"], b["caption"])
    np.testing.assert_array_equal(a["text"], b["text"])
    c = captioned.get("train", idx, epoch=3)
    assert np.mean(a["caption"] != c["caption"]) > 0.5
    t = np.arange(captioned.split_size("test"))
    np.testing.assert_array_equal(captioned.get("test", t, epoch=0)["caption"],
                                  captioned.get("test", t, epoch=5)["caption"])


def test_captions_differ_within_a_class(captioned):
    batch = captioned.get("test", np.arange(captioned.split_size("test")))
    for label in range(captioned.num_classes):
        texts = batch["caption"][batch["label"] == label]
        assert len(set(texts)) >= len(texts) // 2


def test_adding_captions_leaves_the_images_unchanged(small_digits, captioned):
    idx = np.arange(6)
    np.testing.assert_array_equal(captioned.get("train", idx, epoch=1)["image"],
                                  small_digits.get("train", idx, epoch=1)["image"])


def test_text_batch_format_and_padding_mask(captioned):
    batch = captioned.get("train", np.arange(8))
    assert batch["text"].shape == (8, 16) and batch["text"].dtype == np.int32
    assert batch["text_mask"].dtype == bool
    np.testing.assert_array_equal(batch["text"] == PAD_ID, ~batch["text_mask"])
    # The mask is a prefix: real pieces first, padding after.
    lengths = batch["text_mask"].sum(1)
    np.testing.assert_array_equal(batch["text_mask"], np.arange(16)[None] < lengths[:, None])
    assert captioned.tokenizer.decode(batch["text"]) == list(batch["caption"])


def test_every_caption_fits_sixteen_subword_tokens(captioned):
    tok = captioned.tokenizer
    lengths = [len(tok.pieces(c)) for c in captioned.split_captions("test")]
    assert max(lengths) <= 16
    # Subwords: a word never seen in training is spelled with known pieces, not mapped to the unknown id.
    ids, mask = tok.encode(["twelve zeros"])
    assert mask.sum() > 2 and UNK_ID not in ids[mask]


def test_prompts_are_tokenized_per_class_and_template(captioned):
    ids, mask = captioned.prompts()
    assert ids.shape == mask.shape == (10, len(ZERO_SHOT_TEMPLATES), 16)
    assert captioned.tokenizer.decode(ids[3])[2] == "a handwritten three"


def test_tokenizer_is_deterministic_across_processes():
    sentences = ["a small two in the top", "the digit nine in large print near the left"] * 20
    model = SubwordTokenizer.train(sentences, vocab_size=40).to_bytes()
    assert SubwordTokenizer.train(sentences, vocab_size=40).to_bytes() == model
    code = ("import sys; from moe_course.data.tokenizer import SubwordTokenizer as T; "
            "s = ['a small two in the top', 'the digit nine in large print near the left'] * 20; "
            "sys.stdout.buffer.write(T.train(s, vocab_size=40).to_bytes())")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout == model


def test_tokenizer_round_trip_truncation_and_errors():
    tok = SubwordTokenizer.train(["a small two in the top left"] * 10, vocab_size=30, seq_len=4)
    ids, mask = tok.encode(["a small two in the top left", ""])
    assert ids.shape == (2, 4) and mask[0].all() and not mask[1].any()
    again = SubwordTokenizer.from_bytes(tok.to_bytes(), seq_len=4)
    np.testing.assert_array_equal(again.encode(["a small two"])[0], tok.encode(["a small two"])[0])
    with pytest.raises(ValueError, match="seq_len=0"):
        SubwordTokenizer.from_bytes(tok.to_bytes(), seq_len=0)
    with pytest.raises(ValueError, match="sentences is empty"):
        SubwordTokenizer.train([])
    with pytest.raises(ValueError, match="vocab_size=9 cannot be trained"):
        SubwordTokenizer.train(["abcdefghijklmnopqrstuvwxyz"], vocab_size=9)
    with pytest.raises(ValueError, match="not a SentencePiece model"):
        SubwordTokenizer(b"not a model")


def test_captioned_digits_refuses_bad_settings(small_digits, captioned):
    with pytest.raises(ValueError, match="seq_len=0"):
        CaptionedDigits(small_digits, seq_len=0)
    with pytest.raises(ValueError, match="seq_len=8 disagrees"):
        CaptionedDigits(small_digits, tokenizer=captioned.tokenizer, seq_len=8)


def test_attribute_templates_cover_every_size_and_position_and_name_only_the_class():
    templates = attribute_templates()
    assert len(templates) == len(CAPTION_TEMPLATES) * 3 * 9 == len(set(templates))
    drawn = {position_phrase(top, left, 14, 32) for top in range(19) for left in range(19)}
    assert drawn == set(POSITION_PHRASES)
    assert all("{name}" in t and "{size}" not in t and "{position}" not in t for t in templates)
    assert ZERO_SHOT_TEMPLATES[:len(PROMPT_TEMPLATES)] == PROMPT_TEMPLATES
