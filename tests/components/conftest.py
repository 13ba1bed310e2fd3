"""Shared fixtures of the trainer tests: a small synthetic tokenized corpus."""

import numpy as np
import pytest


def synthetic_documents(n_docs: int = 300, vocab: int = 512, seed: int = 0) -> list[list[int]]:
    """Documents of 3-40 'words', each word a fixed 1-4 token sequence of a 60-word lexicon."""
    rng = np.random.default_rng(seed)
    lexicon = [rng.integers(3, vocab, rng.integers(1, 5)).tolist() for _ in range(60)]
    return [[t for w in rng.integers(0, 60, rng.integers(3, 40)) for t in lexicon[w]]
            for _ in range(n_docs)]


@pytest.fixture(scope="session")
def make_documents():
    """`synthetic_documents`, as a fixture: a test module cannot import it from
    `conftest` (under pytest-xdist that name may resolve to another folder's conftest)."""
    return synthetic_documents


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("data") / "train-00000-of-00001.gz")
    from components.trainer import data

    data.write_examples(path, synthetic_documents())
    return path
