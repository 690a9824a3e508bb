"""Tokenizers behind one small interface.

The data pipeline needs only: ``encode`` / ``encode_batch`` (text -> int32
ids, no special tokens added), ``decode`` (ids -> text, special tokens
skipped), ``bos_id``, ``eos_id``, ``pad_id``, ``vocab_size`` and ``name``
(recorded in the data fingerprint).

Two implementations:

* ``ByteTokenizer``: the 256 byte values plus three special ids. Needs no
  files, so any corpus works out of the box and bits-per-byte is exact.
* ``HFTokenizer``: a local Hugging Face ``tokenizer.json``.

``data.tokenizer=bpe`` trains one (``bpe_tokenizer``): a byte-level BPE of ``data.vocab_size`` ids
(the 256 byte values, the merges, and ``<|endoftext|>``) learnt from the training split alone with the
Hugging Face ``tokenizers`` library. Byte-level means every text encodes, and decodes back to itself,
without an unknown token. Training happens once per corpus and vocabulary size: the file is cached
under ``$LMZOO_CACHE`` (default ``~/.cache/lmzoo``) by the corpus fingerprint, and a run keeps its own
copy (``lmzoo.record.directory.TOKENIZER``), which evaluation and generation load.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence, Union

import numpy as np

if TYPE_CHECKING:
    import tokenizers as hf_tokenizers

Text = Union[str, bytes]

# Token spellings looked up (in this order) to find the special ids of a
# Hugging Face tokenizer; they cover the common GPT-2, Llama, T5 and BERT-style
# vocabularies.
BOS_CANDIDATES = ("<bos>", "<s>", "[BOS]", "<|begin_of_text|>", "<|startoftext|>")
EOS_CANDIDATES = ("<eos>", "</s>", "[EOS]", "<|endoftext|>", "<|end_of_text|>")
PAD_CANDIDATES = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>")


def _as_str(text: Text) -> str:
    if isinstance(text, bytes):
        return text.decode("utf-8", errors="replace")
    return text


def _as_bytes(text: Text) -> bytes:
    if isinstance(text, str):
        return text.encode("utf-8")
    return bytes(text)


class ByteTokenizer:
    """UTF-8 bytes are the tokens (ids 0..255); 256..258 are BOS, EOS, PAD."""

    name = "byte"
    bos_id = 256
    eos_id = 257
    pad_id = 258
    vocab_size = 259

    def encode(self, text: Text) -> np.ndarray:
        return np.frombuffer(_as_bytes(text), dtype=np.uint8).astype(np.int32)

    def encode_batch(self, texts: Iterable[Text]) -> list[np.ndarray]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = np.asarray(ids).ravel()
        byte_ids = ids[(ids >= 0) & (ids < 256)].astype(np.uint8)
        return byte_ids.tobytes().decode("utf-8", errors="replace")


def _first_known_token(tokenizer: "hf_tokenizers.Tokenizer", candidates: Sequence[str]) -> int | None:
    for token in candidates:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    return None


def _file_sha256(path: str) -> str:
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` behind the ``ByteTokenizer`` interface.

    Special ids come from the first token of ``*_CANDIDATES`` that the
    vocabulary contains. EOS is required because it separates documents in
    the token stream; a missing BOS or PAD falls back to the EOS id.
    """

    def __init__(self, path: str):
        self.path = path
        try:
            import tokenizers as hf_tokenizers  # an optional extra: only users with their own vocabulary need it
        except ImportError:
            raise ValueError(f"data.tokenizer={path!r} needs the Hugging Face tokenizers package: "
                             "pip install -e '.[hf]'") from None
        try:
            self._tokenizer = hf_tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # the Rust library raises a bare Exception for a file that does not parse
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(f"tokenizer file {path} cannot be read ({reason}); {repair_advice(path)}") from None
        eos_id = _first_known_token(self._tokenizer, EOS_CANDIDATES)
        if eos_id is None:
            raise ValueError(f"tokenizer {path} has no end-of-sequence token; looked for {list(EOS_CANDIDATES)}")
        bos_id = _first_known_token(self._tokenizer, BOS_CANDIDATES)
        pad_id = _first_known_token(self._tokenizer, PAD_CANDIDATES)
        self.eos_id = eos_id
        self.bos_id = eos_id if bos_id is None else bos_id
        self.pad_id = eos_id if pad_id is None else pad_id
        self.vocab_size = self._tokenizer.get_vocab_size()
        # The content hash makes the name identify the vocabulary, not the
        # machine-specific path it was loaded from.
        self.name = f"hf:{os.path.basename(path)}@{_file_sha256(path)[:12]}"

    def encode(self, text: Text) -> np.ndarray:
        encoding = self._tokenizer.encode(_as_str(text), add_special_tokens=False)
        return np.asarray(encoding.ids, dtype=np.int32)

    def encode_batch(self, texts: Iterable[Text]) -> list[np.ndarray]:
        # The Rust side encodes the batch in parallel; offsets are not needed.
        encodings = self._tokenizer.encode_batch_fast([_as_str(t) for t in texts], add_special_tokens=False)
        return [np.asarray(encoding.ids, dtype=np.int32) for encoding in encodings]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        # The special ids may be ordinary vocabulary entries that
        # skip_special_tokens would keep, so they are dropped explicitly too.
        specials = {self.bos_id, self.eos_id, self.pad_id}
        kept = [int(i) for i in np.asarray(ids).ravel() if int(i) not in specials]
        return self._tokenizer.decode(kept, skip_special_tokens=True)


Tokenizer = Union[ByteTokenizer, HFTokenizer]


def build_tokenizer(spec: str) -> Tokenizer:
    """``"byte"`` gives a ``ByteTokenizer``; anything else but ``"bpe"`` (which needs the corpus: ``bpe_tokenizer``)
    is a tokenizer.json path."""
    if spec == "byte":
        return ByteTokenizer()
    if spec == BPE:
        raise ValueError("data.tokenizer=bpe is trained on a corpus: build it with bpe_tokenizer(documents, ...)")
    if not os.path.isfile(spec):
        raise FileNotFoundError(f"tokenizer file not found: {spec!r} "
                                "(data.tokenizer is 'byte' or a path to a tokenizer.json)")
    return HFTokenizer(spec)


# ----------------------------------------------------------------------------- byte-level BPE trained on the corpus

BPE = "bpe"  # data.tokenizer: train one on the training split
BPE_EOS = "<|endoftext|>"  # its only special token: ends every document (BOS and PAD fall back to it)
# What a cached tokenizer was trained by; a change to ``train_bpe`` changes it, so old cache files are not reused.
BPE_RECIPE = "byte-level-bpe/gpt2-regex/v1"
BPE_MIN_VOCAB = 257  # the 256 byte values and the end-of-text token


def cache_dir() -> Path:
    """Where lmzoo keeps what it derives once per machine: ``$LMZOO_CACHE``, else ``$XDG_CACHE_HOME/lmzoo``."""
    if os.environ.get("LMZOO_CACHE"):
        return Path(os.environ["LMZOO_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lmzoo"


def repair_advice(path: str) -> str:
    """What to do about a damaged tokenizer file, by where it lives."""
    if Path(path).resolve().is_relative_to(cache_dir().resolve()):
        return f"delete its cache folder {Path(path).parent} and it is trained again"
    if Path(path).name == "tokenizer.json" and (Path(path).parent / "config.yaml").exists():
        return ("it is the run's own copy: put back an intact one (the BPE cache under "
                f"{cache_dir() / 'tokenizers'} holds the one its corpus trained, if not cleared)")
    return "point data.tokenizer at an intact tokenizer.json"


def bpe_cache_path(corpus_fingerprint: dict[str, Any], vocab_size: int) -> Path:
    """The cache file of the BPE that ``vocab_size`` and the corpus (its training split) determine."""
    key = json.dumps({"recipe": BPE_RECIPE, "vocab_size": vocab_size, "corpus": corpus_fingerprint},
                     sort_keys=True, default=str)
    return cache_dir() / "tokenizers" / hashlib.sha256(key.encode()).hexdigest()[:24] / "tokenizer.json"


def train_bpe(documents: Sequence[bytes], vocab_size: int, path: Path | str) -> None:
    """Learn a byte-level BPE of ``vocab_size`` ids from ``documents`` and write its ``tokenizer.json`` to ``path``.

    GPT-2's pre-tokenisation (words, numbers, punctuation runs and spaces kept apart, a space joined to
    the word after it) bounds the merges; the initial alphabet is all 256 bytes, so nothing is unknown.
    """
    try:
        from tokenizers import Tokenizer as RustTokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise ValueError("data.tokenizer=bpe needs the Hugging Face tokenizers package: "
                         "pip install tokenizers") from None

    tokenizer = RustTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BPE_EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator((_as_str(document) for document in documents), trainer, length=len(documents))
    tokenizer.save(str(path))


def bpe_tokenizer(documents: Sequence[bytes], vocab_size: int, corpus_fingerprint: dict[str, Any]) -> HFTokenizer:
    """The BPE of ``vocab_size`` learnt from ``documents`` (a corpus's training split, which its
    fingerprint identifies): from the cache, or trained and cached now."""
    path = bpe_cache_path(corpus_fingerprint, vocab_size)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written whole under a temporary name, then renamed: processes training at once never read half a file.
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".json.tmp")
        os.close(handle)
        try:
            train_bpe(documents, vocab_size, temporary)
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
    return HFTokenizer(str(path))
