"""A real subword tokenizer (SentencePiece, as LIMoE uses; Sec. 2.2), trained locally on the training captions.

LIMoE's text input is a one-hot SentencePiece encoding with a learned vocabulary, at sequence length 16
(App. A). ``SubwordTokenizer.train`` fits a SentencePiece BPE (or unigram) model on a list of sentences in
well under a second for the embedded captions, so a dataset rebuilds it instead of shipping a model file;
``to_bytes`` / ``from_bytes`` keep one (e.g. in a run folder). Training is deterministic: one thread, the
sentences in the order given, no input sampling -- the same sentences give the same byte-identical model.

``encode`` maps sentences to a fixed-length id matrix and a padding mask: id ``PAD_ID`` = 0 fills the
positions after the last piece, and sentences longer than ``seq_len`` pieces are cut. Id 1 is the unknown
piece; there are no begin/end-of-sentence pieces (the model average-pools the tokens, nothing reads a
boundary marker).
"""

from __future__ import annotations

import io
from typing import Sequence

import numpy as np

PAD_ID = 0
UNK_ID = 1
MODEL_TYPES = ("bpe", "unigram")


def _check_seq_len(seq_len) -> int:
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} is not allowed; use an integer >= 1 (tokens per caption)")
    return seq_len


class SubwordTokenizer:
    """A trained SentencePiece model plus the fixed sequence length of the model's text input.

    model_proto: the serialized SentencePiece model (``to_bytes``). seq_len: tokens per encoded sentence.
    Raises ValueError for seq_len < 1 or bytes that are not a SentencePiece model.
    """

    def __init__(self, model_proto: bytes, *, seq_len: int = 16):
        import sentencepiece as spm

        self.seq_len = _check_seq_len(seq_len)
        self._proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(self._proto)
        except (RuntimeError, OSError) as exc:
            raise ValueError(f"model_proto is not a SentencePiece model ({exc})") from exc
        if self._sp.pad_id() != PAD_ID:
            raise ValueError(f"model_proto has pad id {self._sp.pad_id()}; this tokenizer needs pad id {PAD_ID}")

    @classmethod
    def train(cls, sentences: Sequence[str], *, vocab_size: int = 128, seq_len: int = 16,
              model_type: str = "bpe") -> "SubwordTokenizer":
        """Fit a SentencePiece model to ``sentences`` (a non-empty list of str), deterministically.

        vocab_size: pieces including pad and unknown; SentencePiece may return fewer when the sentences do
        not support that many (a soft limit). It must at least hold every character of the corpus.
        model_type: "bpe" (default: on the small caption language it keeps whole frequent words and splits
        rarer ones, so a caption fits 16 tokens at 128 pieces) or "unigram" (SentencePiece's default).
        Raises ValueError for an empty corpus, vocab_size < 8 or too small for the corpus' characters, or an
        unknown model_type.
        """
        import sentencepiece as spm

        sentences = [str(s) for s in sentences]
        if not sentences:
            raise ValueError("sentences is empty; train the tokenizer on at least one caption")
        if not isinstance(vocab_size, int) or vocab_size < 8:
            raise ValueError(f"vocab_size={vocab_size!r} is not allowed; use an integer >= 8")
        if model_type not in MODEL_TYPES:
            raise ValueError(f"model_type={model_type!r} is not allowed; use one of {', '.join(MODEL_TYPES)}")
        buffer = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences), model_writer=buffer, vocab_size=vocab_size,
                model_type=model_type, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=-1, eos_id=-1, hard_vocab_limit=False,
                num_threads=1, shuffle_input_sentence=False, input_sentence_size=0, minloglevel=2,
            )
        except RuntimeError as exc:  # SentencePiece's own message says which limit was hit
            raise ValueError(f"vocab_size={vocab_size} cannot be trained on these sentences: {exc}") from exc
        return cls(buffer.getvalue(), seq_len=seq_len)

    @classmethod
    def from_bytes(cls, model_proto: bytes, *, seq_len: int = 16) -> "SubwordTokenizer":
        """The tokenizer of a model saved with ``to_bytes``."""
        return cls(model_proto, seq_len=seq_len)

    def to_bytes(self) -> bytes:
        """The serialized SentencePiece model (equal bytes for equal training input)."""
        return self._proto

    @property
    def vocab_size(self) -> int:
        """Number of pieces, pad and unknown included: ids lie in [0, vocab_size)."""
        return self._sp.get_piece_size()

    def pieces(self, sentence: str) -> list[str]:
        """The subword pieces of one sentence, uncut (for display)."""
        return self._sp.encode(sentence, out_type=str)

    def encode(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """sentences (n,) str -> (ids (n, seq_len) int32, mask (n, seq_len) bool; True = a real piece).

        Pieces past ``seq_len`` are cut; positions after the last piece hold ``PAD_ID`` with mask False.
        An empty sentence is all padding.
        """
        n = len(sentences)
        ids = np.full((n, self.seq_len), PAD_ID, np.int32)
        mask = np.zeros((n, self.seq_len), bool)
        for row, pieces in enumerate(self._sp.encode([str(s) for s in sentences])):
            pieces = pieces[: self.seq_len]
            ids[row, : len(pieces)] = pieces
            mask[row, : len(pieces)] = True
        return ids, mask

    def decode(self, ids: np.ndarray) -> list[str]:
        """(n, seq_len) ids -> n sentences; padding is skipped."""
        return [self._sp.decode([int(i) for i in row if i != PAD_ID]) for row in np.asarray(ids)]
