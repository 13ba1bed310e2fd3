"""A lossless WordPiece tokenizer built from TensorFlow and tensorflow-text ops.

The same functions run in three places: inside tf.Transform's `preprocessing_fn`
(tokenizing the corpus), inside the pushed SavedModel (so it serves raw text), and
in tests. Only `tensorflow` and `tensorflow_text` are imported (`tokenizers`,
for learning a vocabulary, only when `learn_vocabulary` is called).

How text becomes ids:
  1. Pre-tokenization (`pretokenize`) cuts text into pieces with one regular
     expression, GPT-2 style: an optional leading space plus a run of letters,
     digits or other symbols, or one whitespace character. Every character lands
     in exactly one piece, so joining the pieces gives the text back.
  2. Whitespace pieces other than a space (newline, tab, ...) are written as
     placeholders `<wsN>` (N = code point): vocabulary files hold one token per
     line, and a placeholder mixes character classes, so no real piece can
     ever equal it.
  3. `tensorflow_text.WordpieceTokenizer` (greedy longest match first) cuts each
     piece into vocabulary entries; continuation entries start with `JOINER`.

Decoding maps each id to its surface text (`surface_forms`) and concatenates.
`decode(encode(x)) == x` for any text whose characters are in the vocabulary;
the vocabulary holds every character seen in training (up to
`max_unique_chars`), alone and as a continuation, so held-out text made of seen
characters round-trips.

The joiner is the control character U+001F: the cleaning step removes control
characters, so no training piece starts with it and continuation entries can
never be confused with pieces.

Reference: Wu et al. 2016 (WordPiece, arXiv 1609.08144). The vocabulary is
learned by Hugging Face `tokenizers`' WordPieceTrainer (`learn_vocabulary`).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping

import tensorflow as tf
import tensorflow_text as tf_text

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
EOS_TOKEN = "[EOS]"
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, EOS_TOKEN)
PAD_ID, UNK_ID, EOS_ID = 0, 1, 2

JOINER = "\x1f"
# An optional space then letters, or digits, or other non-space symbols; or one
# whitespace character. (Bounded repeats like {1,64} blow up RE2's DFA here.)
PRETOKENIZE_PATTERN = r" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s"
# Pieces longer than this many bytes become [UNK] (WordpieceTokenizer's limit).
MAX_BYTES_PER_PIECE = 1024


def whitespace_placeholder(char: str) -> str:
    """`'\\n'` -> `'<ws10>'`: the vocabulary form of a non-space whitespace character."""
    return f"<ws{ord(char)}>"


def pretokenize(texts: tf.Tensor) -> tf.RaggedTensor:
    """Cuts texts into pre-tokens, losslessly.

    Args:
      texts: tf.string [batch], UTF-8.

    Returns:
      tf.string ragged [batch, (pieces)]. Joining a row gives its text back,
      except that whitespace other than U+0020 appears as `<wsN>` placeholders.
    """
    pieces = tf_text.regex_split(texts, PRETOKENIZE_PATTERN, PRETOKENIZE_PATTERN)
    flat = pieces.flat_values
    is_other_whitespace = tf.strings.regex_full_match(flat, r"[^ \S]")
    # A whitespace piece is one character: its first code point names it.
    first_code_point = tf.strings.unicode_decode(
        tf.strings.substr(flat, 0, 1, unit="UTF8_CHAR"), "UTF-8"
    ).to_tensor(default_value=0, shape=[None, 1])[:, 0]
    placeholder = tf.strings.join(["<ws", tf.strings.as_string(first_code_point), ">"])
    flat = tf.where(is_other_whitespace, placeholder, flat)
    return pieces.with_flat_values(flat)


def make_wordpiece_tokenizer(vocabulary: str | tf.Tensor | tf.lookup.StaticHashTable):
    """Builds the `WordpieceTokenizer` over a vocabulary file (one token per line).

    Args:
      vocabulary: a vocabulary file path (str or a scalar tf.string tensor, e.g.
        the deferred asset path of a tf.Transform analyzer) or a lookup table.

    Returns:
      `tensorflow_text.WordpieceTokenizer` producing tf.int64 ids.
    """
    if isinstance(vocabulary, (str, tf.Tensor)):
        initializer = tf.lookup.TextFileInitializer(
            vocabulary,
            key_dtype=tf.string,
            key_index=tf.lookup.TextFileIndex.WHOLE_LINE,
            value_dtype=tf.int64,
            value_index=tf.lookup.TextFileIndex.LINE_NUMBER,
        )
        vocabulary = tf.lookup.StaticHashTable(initializer, default_value=UNK_ID)
    return tf_text.WordpieceTokenizer(
        vocabulary,
        suffix_indicator=JOINER,
        max_bytes_per_word=MAX_BYTES_PER_PIECE,
        token_out_type=tf.int64,
        unknown_token=UNK_TOKEN,
    )


def encode(texts: tf.Tensor, tokenizer) -> tf.RaggedTensor:
    """Text to token ids.

    Args:
      texts: tf.string [batch].
      tokenizer: from `make_wordpiece_tokenizer`.

    Returns:
      tf.int64 ragged [batch, (tokens)].
    """
    pieces = pretokenize(texts)  # (B, pieces)
    ids = tokenizer.tokenize(pieces)  # (B, pieces, wordpieces)
    return ids.merge_dims(1, 2)  # (B, tokens)


def surface_forms(vocabulary: list[str]) -> list[str]:
    """The text each vocabulary entry stands for ("" for special tokens)."""
    forms = []
    for token in vocabulary:
        if token in SPECIAL_TOKENS or token.startswith("[unused"):
            forms.append("")
        elif token.startswith(JOINER):
            forms.append(token[len(JOINER):])
        elif token.startswith("<ws") and token.endswith(">") and token[3:-1].isdigit():
            forms.append(chr(int(token[3:-1])))
        else:
            forms.append(token)
    return forms


def decode_ids(ids: tf.Tensor, surfaces: tf.Tensor) -> tf.Tensor:
    """Token ids to text, in the graph.

    Args:
      ids: integer [batch, tokens] (dense; pad with PAD_ID, whose surface is "").
      surfaces: tf.string [vocab_size] from `surface_forms`.

    Returns:
      tf.string [batch].
    """
    pieces = tf.gather(surfaces, tf.cast(ids, tf.int32))  # (B, T)
    return tf.strings.reduce_join(pieces, axis=-1)


def split_at_spaces(texts: tf.Tensor) -> tf.RaggedTensor:
    """Cuts texts at every U+0020 into units that pre-tokenize independently.

    A pre-token never contains a space except one leading space, which always
    belongs to what follows it (`PRETOKENIZE_PATTERN`). So cutting the text at
    each space and keeping the space with the chunk after it loses no pre-token
    boundary: the pre-tokens of a text are the pre-tokens of its units, counted
    together. This is how Transform counts pre-tokens cheaply in its analyze
    pass (`tf.strings.split`, ~50 MB/s here, instead of the regular expression,
    ~1.5 MB/s); the distinct units are pre-tokenized once each afterwards
    (`count_unit_pieces`).

    Args:
      texts: tf.string [batch], UTF-8.

    Returns:
      tf.string ragged [batch, (units)]: the text before the first space, then
      " " + each later chunk (a chunk may be empty, or hold other whitespace).
    """
    chunks = tf.strings.split(texts, sep=" ")  # (B, chunks)
    position = tf.ragged.range(chunks.row_lengths()).flat_values  # (chunks,) index in its row
    prefix = tf.where(position > 0, " ", "")
    return chunks.with_flat_values(tf.strings.join([prefix, chunks.flat_values]))


def count_unit_pieces(unit_counts: Mapping[str | bytes, int],
                      batch_size: int = 4096) -> collections.Counter:
    """Pre-token counts from counts of `split_at_spaces` units.

    Args:
      unit_counts: unit -> how often it occurs.
      batch_size: units pre-tokenized per call.

    Returns:
      pre-token (bytes) -> count: what `count_pieces` gives on the texts the
      units came from.
    """
    counts: collections.Counter = collections.Counter()
    units = [u for u, n in unit_counts.items() if u and n]
    for start in range(0, len(units), batch_size):
        batch = units[start:start + batch_size]
        pieces = pretokenize(tf.constant(batch))  # (batch, pieces)
        # Each piece weighs as much as the unit it came from.
        weights = tf.repeat(tf.constant([int(unit_counts[u]) for u in batch], tf.int64),
                            pieces.row_lengths())  # (pieces,)
        for piece, weight in zip(pieces.flat_values.numpy().tolist(),
                                 weights.numpy().tolist(), strict=True):
            counts[piece] += weight
    return counts


def count_pieces(texts: Iterable[str | bytes], batch_size: int = 1024) -> collections.Counter:
    """Counts pre-tokens of texts (eagerly), for learning a vocabulary outside Beam."""
    counts: collections.Counter = collections.Counter()
    batch: list = []
    for text in texts:
        batch.append(text)
        if len(batch) == batch_size:
            counts.update(pretokenize(tf.constant(batch)).flat_values.numpy().tolist())
            batch = []
    if batch:
        counts.update(pretokenize(tf.constant(batch)).flat_values.numpy().tolist())
    return counts


def learn_vocabulary(
    piece_counts: Mapping[str | bytes, int],
    vocab_size: int,
    max_unique_chars: int = 1000,
) -> list[str]:
    """Learns a WordPiece vocabulary of exactly `vocab_size` entries.

    Uses Hugging Face `tokenizers`' `WordPieceTrainer` (Rust; BPE merges turned
    into a WordPiece vocabulary, as for BERT-style tokenizers), then orders the
    result as: special tokens, whitespace placeholders, single characters,
    single characters as continuations, then the learned pieces in the order the
    trainer made them; truncates or pads (`[unusedN]`, unreachable from text) to
    `vocab_size`. Characters and placeholders always survive, which is what makes
    encoding lossless.

    The result is deterministic: the trainer numbers continuation symbols in
    hash-map order (huggingface/tokenizers#1794, six different vocabularies in
    six runs on the same counts here), so every continuation character is
    registered up front, in a fixed order, as a trainer special token.

    Args:
      piece_counts: pre-token -> count (from `pretokenize` over the training
        text). Pieces never contain a line break (`pretokenize` writes
        whitespace other than U+0020 as placeholders).
      vocab_size: exact size of the result.
      max_unique_chars: alphabet size limit (`limit_alphabet` of the trainer).

    Returns:
      The vocabulary, one token per entry; id = index.

    Raises:
      ValueError: `piece_counts` is empty, a piece contains a line break, or the
        alphabet alone needs more than `vocab_size` entries.
    """
    import tokenizers
    from tokenizers import models, pre_tokenizers, trainers

    counts: collections.Counter = collections.Counter()
    for piece, count in piece_counts.items():
        if isinstance(piece, bytes):
            piece = piece.decode("utf-8")
        if "\n" in piece or "\r" in piece:
            raise ValueError(f"pre-token {piece!r} contains a line break")
        if piece:
            counts[piece] += int(count)
    if not counts:
        raise ValueError("cannot learn a vocabulary from no text (the training split is empty)")

    placeholders = sorted(p for p in counts if p.startswith("<ws") and p.endswith(">"))
    words = {p: c for p, c in counts.items() if p not in placeholders}
    char_counts: collections.Counter = collections.Counter()
    for word, count in words.items():
        for ch in word:
            char_counts[ch] += count
    chars = [c for c, _ in sorted(char_counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    chars = chars[:max_unique_chars]
    head = list(SPECIAL_TOKENS) + placeholders + chars + [JOINER + c for c in chars]
    if len(head) > vocab_size:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for {len(chars)} characters and "
            f"{len(placeholders)} whitespace placeholders (needs > {len(head)})"
        )

    learned: list[str] = []
    if words:
        model = tokenizers.Tokenizer(models.WordPiece(unk_token=UNK_TOKEN,
                                                      continuing_subword_prefix=JOINER))
        # One "sentence" per line, one word per line: the trainer counts in Rust.
        model.pre_tokenizer = pre_tokenizers.Split("\n", behavior="removed")
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=2,
            limit_alphabet=max_unique_chars,
            continuing_subword_prefix=JOINER,
            special_tokens=[JOINER + c for c in sorted(char_counts)],
            show_progress=False,
        )
        model.train_from_iterator(_repeated_lines(words), trainer)
        learned = [t for t, _ in sorted(model.get_vocab().items(), key=lambda kv: kv[1])]

    seen = set(head)
    vocabulary = list(head)
    for token in learned:
        if len(vocabulary) == vocab_size:
            break
        if token not in seen and not token.startswith("["):
            seen.add(token)
            vocabulary.append(token)
    vocabulary += [f"[unused{i}]" for i in range(vocab_size - len(vocabulary))]
    return vocabulary


def _repeated_lines(words: Mapping[str, int], lines_per_chunk: int = 10_000):
    """Yields each word `count` times, one per line, in chunks (sorted: the
    trainer then sees the same input whatever order the counts came in)."""
    for word, count in sorted(words.items()):
        for start in range(0, count, lines_per_chunk):
            yield "\n".join([word] * min(lines_per_chunk, count - start))


def write_vocabulary(vocabulary: list[str], path: str) -> None:
    """Writes one token per line (tokens never contain line breaks)."""
    for token in vocabulary:
        if "\n" in token or "\r" in token:
            raise ValueError(f"vocabulary token {token!r} contains a line break")
    with tf.io.gfile.GFile(path, "w") as f:
        f.write("\n".join(vocabulary) + "\n")


def read_vocabulary(path: str) -> list[str]:
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read().decode("utf-8").split("\n")[:-1]
