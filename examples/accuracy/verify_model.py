"""Checks that the NumPy all-MiniLM-L6-v2 computes what the published model does.

Run alone (`python3 verify_model.py`) or from study.py, which stops on failure.
"""

from __future__ import annotations

import sys

import numpy as np

import metrics
import texts
from minilm import MiniLM

# Published outputs of sentence-transformers' all-MiniLM-L6-v2:
# the similarity matrix of the sentence-transformers quickstart ...
SIMILARITY_SENTENCES = ("The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium.")
SIMILARITY_MATRIX = np.array([[1.0000, 0.6660, 0.1046], [0.6660, 1.0000, 0.1411], [0.1046, 0.1411, 1.0000]])
# ... and the first five components of the embedding of "hello world", as
# fastembed's test suite pins them for this model (mean pooling, normalised).
HELLO_TEXT = "hello world"
HELLO_HEAD = np.array([-0.034478, 0.03102, 0.00673, 0.02611, -0.039362])
# Both are printed to 4-6 decimals; a wrong tokenizer, pooling or GELU moves
# them by 1e-2 or more.
TOLERANCE = 1e-4


def check(model: MiniLM) -> dict:
    """The figures of the three checks; raises AssertionError when one fails."""
    e = model.embed(list(SIMILARITY_SENTENCES))
    sim_err = float(np.abs(e @ e.T - SIMILARITY_MATRIX).max())
    hello = model.embed([HELLO_TEXT])[0, : HELLO_HEAD.size]
    hello_err = float(np.abs(hello - HELLO_HEAD).max())

    # Paraphrases closer than unrelated sentences: the pairs' mean similarity
    # against the mean over all other pairs, and how often a sentence's
    # nearest neighbour is its partner.
    s = model.embed(texts.sentences())
    sim = s @ s.T
    n = len(s)
    partner = np.arange(n) ^ 1
    unrelated = ~np.eye(n, dtype=bool)
    unrelated[np.arange(n), partner] = False
    figures = {
        "similarity_matrix_max_err": sim_err,
        "hello_world_max_err": hello_err,
        "paraphrase_mean_cos": float(sim[np.arange(n), partner].mean()),
        "unrelated_mean_cos": float(sim[unrelated].mean()),
        "partner_is_nearest": metrics.retrieval(s, s)["partner_is_nearest"],
    }
    assert sim_err <= TOLERANCE, f"similarity matrix off by {sim_err:.2e}"
    assert hello_err <= TOLERANCE, f"'{HELLO_TEXT}' embedding off by {hello_err:.2e}"
    assert figures["paraphrase_mean_cos"] > figures["unrelated_mean_cos"], "paraphrases are not closer"
    return figures


if __name__ == "__main__":
    try:
        result = check(MiniLM())
    except AssertionError as e:
        sys.exit(f"FAILED: {e}")
    for key, value in result.items():
        print(f"{key:28s} {value:.6g}")
    print("the NumPy model matches the published all-MiniLM-L6-v2 outputs")
