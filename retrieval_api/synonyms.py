"""Word neighbours for paraphrase-like calibration queries (`retrieval_api.selfsupervised`).

Real questions rarely use a document's own words; the calibration simulates that vocabulary
mismatch by replacing words of a query with a near neighbour. `synonyms.json` (shipped) maps
every whole-word entry of the all-MiniLM-L6-v2 WordPiece vocabulary (Apache-2.0) that is not a
stopword to up to three neighbours by that model's own embeddings (cosine >= 0.55, another
Snowball stem, not sharing the first four letters): `yearly` -> annually, monthly, weekly;
`salary` -> wages, income, earnings. Neighbours are related words, not always exact synonyms
(an antonym or a sibling can appear): good enough to lower lexical overlap while keeping the
topic, which is all the calibration needs. `build_table` rebuilds it (see its docstring).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import Stemmer  # type: ignore[import-not-found]
from numpy.typing import NDArray

from ragcore.sparse import ENGLISH_STOPWORDS

TABLE_PATH = Path(__file__).resolve().parent / "synonyms.json"
MIN_SIMILARITY = 0.55
PER_WORD = 3
_WORD = re.compile(r"[a-z]{3,}")


@lru_cache(maxsize=1)
def neighbours() -> dict[str, list[str]]:
    """word -> its neighbours, most similar first (the shipped table)."""
    doc: dict[str, Any] = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
    table: dict[str, list[str]] = doc["neighbours"]
    return table


def build_table(words: Sequence[str], vectors: NDArray[np.float32]) -> dict[str, list[str]]:
    """The neighbour table of `words` (unit `vectors`, one row per word): for each word that is
    not a stopword, up to `PER_WORD` others with cosine >= `MIN_SIMILARITY`, another Snowball
    stem and neither a prefix relation of four letters. The shipped table is this function
    over the whole-word (`[a-z]{3,}`) entries of the model's `vocab.txt`, embedded as documents
    with the local embedder."""
    stemmer = Stemmer.Stemmer("english")
    keep = [i for i, w in enumerate(words) if _WORD.fullmatch(w) and w not in ENGLISH_STOPWORDS]
    kept = [words[i] for i in keep]
    stems = stemmer.stemWords(kept)
    matrix = np.asarray(vectors, dtype=np.float32)[keep]
    table: dict[str, list[str]] = {}
    for a, word in enumerate(kept):
        similarity = matrix @ matrix[a]
        out: list[str] = []
        seen = {stems[a]}
        for b in np.argsort(-similarity)[:30]:
            other = kept[int(b)]
            if similarity[b] < MIN_SIMILARITY:
                break
            if stems[int(b)] in seen or other[:4] == word[:4]:
                continue
            seen.add(stems[int(b)])
            out.append(other)
            if len(out) == PER_WORD:
                break
        if out:
            table[word] = out
    return table
