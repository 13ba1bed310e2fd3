"""Byte-level BPE encoding and decoding with TensorFlow ops, exact against `tokenizers`.

`BytePairEncoder.encode` gives, for any UTF-8 text, the ids that Hugging Face
`tokenizers` gives for the same tokenizer.json with
`encode(text, add_special_tokens=False).ids`:

  1. Added tokens are cut out first, as `tokenizers`' AddedVocabulary does:
     leftmost-longest matches (an RE2 alternation, longest first), the tokens that
     are not normalized before the normalized ones; each becomes its id.
  2. The rest is pre-tokenized (`pre_tokenizer.PreTokenizer`).
  3. Each distinct piece of the batch is encoded once (`tf.unique`): its bytes
     become the ids of their byte tokens, then merges are applied, lowest rank
     first, until none applies (Sennrich et al. 2016; `tokenizers`
     `models/bpe/word.rs` `merge_all`). All pieces advance together, one merge
     rank per piece per iteration of a `tf.while_loop`: in each piece the
     lowest-ranked pair that has a merge is merged at every place it occurs, left
     to right and without overlaps. That is what `merge_all`'s priority queue does,
     since a merge's result only forms pairs of higher rank (BPE learns merges in
     order). A byte without a token is dropped (`tokenizers` without `unk_token`).

`decode` maps ids to their bytes and joins them, dropping special tokens (as
`decode(ids, skip_special_tokens=True)`); invalid UTF-8 (a cut multi-byte
character) becomes U+FFFD, as `tokenizers`' ByteLevel decoder does.

Only `tensorflow` and `tensorflow_text` ops: the transform graph and the pushed
SavedModel load without `tokenizers`. Its control flow is explicit (`tf.while_loop`),
so `encode` and `decode` are marked `tf.autograph.experimental.do_not_convert`: a
tf.function that calls them (Transform's, the SavedModel's signatures) does not
transpile them, which cost ~2.8 s per function that encodes.
"""

from __future__ import annotations

import re

import tensorflow as tf

from tokenization import ragged_ops
from tokenization.byte_level_bpe import ID_BITS, AddedToken, ByteLevelBpe
from tokenization.pre_tokenizer import PreTokenizer, nul_safe

_NO_MERGE = tf.int64.max
_ID_MASK = (1 << ID_BITS) - 1


class BytePairEncoder(tf.Module):
    """In-graph encoder (and decoder) of a byte-level BPE tokenizer.

    Args:
      pre_tokenizer: the tokenizer.json's `pre_tokenizer` object.
      added_tokens: its added tokens.
      tables: where the merge table and byte ids come from: a `ByteLevelBpe`
        (constant tensors), or the path of a file of `ByteLevelBpe.table_lines()`
        (a str, or a scalar tf.string such as a tf.Transform deferred asset path).
      surfaces: tf.string [vocab_size], the bytes of each id, for `decode`
        (`ByteLevelBpe.surfaces()`); None if only encoding is needed.

    Raises:
      pre_tokenizer.UnsupportedTokenizerError: a pre-tokenizer outside the family.
    """

    def __init__(self, pre_tokenizer: dict, added_tokens: list[AddedToken],
                 tables: ByteLevelBpe | str | tf.Tensor, surfaces: list[bytes] | None = None,
                 name: str | None = None):
        super().__init__(name=name)
        self.pre_tokenizer = PreTokenizer(pre_tokenizer)
        # Added tokens: one RE2 alternation per group, longest first (leftmost-longest).
        groups = [[t for t in added_tokens if not t.normalized],
                  [t for t in added_tokens if t.normalized]]
        self._added_patterns = [
            "|".join(re.escape(t.content).replace("\\ ", " ") for t in
                     sorted(group, key=lambda t: (-len(t.content.encode()), t.content)))
            for group in groups if group]
        self._added_table = None
        if added_tokens:
            self._added_table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    tf.constant([t.content for t in added_tokens]),
                    tf.constant([t.id for t in added_tokens], tf.int64)), default_value=-1)
        if isinstance(tables, ByteLevelBpe):
            keys, values = tables.merge_table()
            keys = [-(b + 1) for b in range(256)] + keys
            values = tables.byte_ids() + values
            initializer = tf.lookup.KeyValueTensorInitializer(
                tf.constant(keys, tf.int64), tf.constant(values, tf.int64))
        else:
            initializer = tf.lookup.TextFileInitializer(
                tables, key_dtype=tf.int64, key_index=0, value_dtype=tf.int64, value_index=1,
                delimiter="\t")
        self._table = tf.lookup.StaticHashTable(initializer, default_value=-1)
        self._surfaces = None if surfaces is None else tf.constant(surfaces, tf.string)

    # -- encoding ---------------------------------------------------------------
    @tf.autograph.experimental.do_not_convert
    def encode(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """Text to ids.

        Args:
          texts: tf.string [N], UTF-8.

        Returns:
          tf.int64 ragged [N, (tokens)].
        """
        texts = tf.reshape(texts, [-1])
        if not self._added_patterns:
            return self._encode_plain(texts)
        parts = tf.RaggedTensor.from_tensor(tf.reshape(texts, [-1, 1]))  # (N, 1)
        for pattern in self._added_patterns:
            flat = parts.flat_values
            is_added = self._added_table.lookup(flat) >= 0  # (P,) already an added token
            split = nul_safe(lambda t, p=pattern: ragged_ops.regex_split(t, p), flat)  # (P, (pieces))
            split = _keep_whole(flat, split, is_added)  # found by an earlier group: stays
            parts = ragged_ops.merge_inner(parts, split)  # (N, (parts))
        flat = parts.flat_values  # (P,)
        added_id = self._added_table.lookup(flat)  # (P,) -1 for plain text
        is_added = added_id >= 0
        plain_positions = tf.where(~is_added)[:, 0]  # (Pp,)
        added_positions = tf.where(is_added)[:, 0]  # (Pa,)
        plain_ids = self._encode_plain(tf.gather(flat, plain_positions))  # (Pp, (ids))
        added_ids = tf.RaggedTensor.from_tensor(
            tf.reshape(tf.gather(added_id, added_positions), [-1, 1]))  # (Pa, 1)
        # Back in text order: part p is row `order[p]` of [plain; added].
        stacked = tf.concat([plain_ids, added_ids], axis=0)  # (P, (ids))
        order = tf.math.invert_permutation(
            tf.cast(tf.concat([plain_positions, added_positions], 0), tf.int32))  # (P,)
        part_ids = tf.gather(stacked, order)  # (P, (ids))
        return ragged_ops.merge_inner(parts, part_ids)  # (N, (ids))

    def _encode_plain(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """Text without added tokens -> ids, tf.int64 ragged [N, (tokens)]."""
        pieces = self.pre_tokenizer(texts)  # (N, (pieces))
        distinct, index = tf.unique(pieces.flat_values)  # (U,), (P,)
        ids = self._merge(distinct)  # (U, (ids))
        return ragged_ops.merge_inner(pieces, tf.gather(ids, index))  # (N, (ids))

    def _merge(self, words: tf.Tensor) -> tf.RaggedTensor:
        """BPE over each word's bytes: tf.string [U] -> tf.int64 ragged [U, (ids)]."""
        byte_ids = self._table.lookup(-tf.range(1, 257, dtype=tf.int64))  # (256,)
        chars = tf.strings.bytes_split(words)  # (U, (bytes))
        values = tf.cast(tf.reshape(tf.io.decode_raw(chars.flat_values, tf.uint8), [-1]), tf.int32)
        symbols = chars.with_flat_values(tf.gather(byte_ids, values))  # (U, (bytes)) ids
        symbols = tf.ragged.boolean_mask(symbols, symbols >= 0)  # bytes without a token go

        num_words = symbols.nrows()
        empty = tf.zeros([0], tf.int64)

        def merge_step(flat, word, done_flat, done_word):
            # Symbols of words with no merge left leave the loop; the others merge once.
            flat, word, finished = _merge_best_pairs(self._table, flat, word, num_words)
            return (tf.boolean_mask(flat, ~finished), tf.boolean_mask(word, ~finished),
                    tf.concat([done_flat, tf.boolean_mask(flat, finished)], 0),
                    tf.concat([done_word, tf.boolean_mask(word, finished)], 0))

        _, _, done_flat, done_word = tf.while_loop(
            lambda flat, *_: tf.size(flat) > 0, merge_step,
            (symbols.flat_values, symbols.value_rowids(), empty, empty),
            shape_invariants=(tf.TensorShape([None]),) * 4)
        order = tf.argsort(done_word, stable=True)  # words in order, symbols in order
        return ragged_ops.from_value_rowids(tf.gather(done_flat, order),
                                            tf.gather(done_word, order), num_words)

    # -- decoding ---------------------------------------------------------------
    @tf.autograph.experimental.do_not_convert
    def decode(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        """Ids to text.

        Args:
          ids: integer [N, tokens], dense or ragged. Special tokens (padding
            included) and ids outside the vocabulary decode to nothing.

        Returns:
          tf.string [N], valid UTF-8.
        """
        if self._surfaces is None:
            raise ValueError("this BytePairEncoder was built without surfaces")
        ids = tf.cast(ids, tf.int64)
        size = tf.shape(self._surfaces, out_type=tf.int64)[0]
        in_range = (ids >= 0) & (ids < size)
        safe = tf.where(in_range, ids, 0) if not isinstance(ids, tf.RaggedTensor) else \
            tf.ragged.map_flat_values(lambda v: tf.where((v >= 0) & (v < size), v, 0), ids)
        pieces = tf.gather(self._surfaces, safe)
        pieces = tf.where(in_range, pieces, "") if not isinstance(ids, tf.RaggedTensor) else \
            tf.ragged.map_flat_values(lambda p, v: tf.where((v >= 0) & (v < size), p, ""),
                                      pieces, ids)
        text = tf.strings.reduce_join(pieces, axis=-1)  # (N,)
        return tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace",
                                            replacement_char=0xFFFD)


def _keep_whole(flat: tf.Tensor, split: tf.RaggedTensor, is_added: tf.Tensor) -> tf.RaggedTensor:
    """Rows of `split`, except that rows where `is_added` become `[flat]` again."""
    whole = tf.RaggedTensor.from_tensor(tf.reshape(flat, [-1, 1]))  # (P, 1)
    # Take each row from `whole` or `split`, keeping the order of rows.
    stacked = tf.concat([split, whole], axis=0)  # (2P, (pieces))
    n = tf.shape(flat, out_type=tf.int64)[0]
    rows = tf.where(is_added, tf.range(n) + n, tf.range(n))
    return tf.gather(stacked, rows)


def _merge_best_pairs(table, flat, word, num_words):
    """One BPE step in every word: merge its lowest-ranked pair wherever it occurs.

    Args:
      table: the merge table (key `left << 21 | right` -> `rank << 21 | merged id`).
      flat: tf.int64 [S], the symbols of the words still merging, word after word.
      word: tf.int64 [S], the word of each symbol (ascending).
      num_words: all words (a bound on `word`).

    Returns:
      (flat [S'], word [S']) after the step, and finished: bool [S'], the symbols
      of words in which no merge applied (they are unchanged).
    """
    n = tf.shape(flat, out_type=tf.int64)[0]
    same_word = tf.equal(word[:-1], word[1:])  # (S-1,) pair (i, i+1) inside one word
    packed = table.lookup(tf.bitwise.left_shift(flat[:-1], ID_BITS) | flat[1:])  # (S-1,)
    rank = tf.where(same_word & (packed >= 0), tf.bitwise.right_shift(packed, ID_BITS),
                    _NO_MERGE)  # (S-1,)
    best = tf.gather(tf.math.unsorted_segment_min(rank, word[:-1], num_words), word)  # (S,)
    finished = tf.equal(best, _NO_MERGE)  # (S,) no merge applies in this symbol's word
    selected = tf.equal(rank, best[:-1]) & ~finished[:-1]  # (S-1,)
    # Overlaps (a pair (x, x) in "x x x") merge left to right: in a run of adjacent
    # selected positions keep every other one, starting at the run's first.
    run_start = selected & ~tf.concat([[False], selected[:-1]], 0)
    position = tf.range(n - 1)
    starts = tf.concat([tf.boolean_mask(position, run_start), [0]], 0)  # [0]: none may start
    start_of_run = tf.gather(starts, tf.maximum(tf.cumsum(tf.cast(run_start, tf.int64)) - 1, 0))
    chosen = selected & (tf.math.floormod(position - start_of_run, 2) == 0)  # (S-1,)
    chosen = tf.concat([chosen, [False]], 0)  # (S,) a merge starts here
    merged_id = tf.concat([tf.bitwise.bitwise_and(packed, _ID_MASK), [0]], 0)  # (S,)
    keep = ~tf.concat([[False], chosen[:-1]], 0)  # (S,) merged into the left neighbour: gone
    new_flat = tf.where(chosen, merged_id, flat)
    return (tf.boolean_mask(new_flat, keep), tf.boolean_mask(word, keep),
            tf.boolean_mask(finished, keep))
