"""The real text of the study, all available offline.

* Long inputs: windows of the GNU GPL v3 as Debian ships it, cut at the
  model's maximum length so every window is a full, unpadded sequence.
* Short inputs: pairs of paraphrases on unrelated topics, for the end-to-end
  embedding and retrieval checks (each sentence's nearest neighbour should be
  its partner).
* Reference sentences whose published embeddings check the NumPy model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from minilm import CLS_ID, SEP_ID

GPL3 = Path("/usr/share/common-licenses/GPL-3")
N_WINDOWS = 4
SPECIAL_TOKENS_PER_SEQUENCE = 2  # [CLS] and [SEP]

PARAPHRASE_PAIRS = (
    ("The cat is sleeping on the warm windowsill.", "A cat naps in the sun by the window."),
    (
        "The stock market fell sharply after the interest rate announcement.",
        "Share prices dropped steeply once the central bank raised rates.",
    ),
    ("She is learning to play the violin.", "She takes lessons to learn the violin."),
    ("The train to Berlin was delayed by two hours.", "Our Berlin train arrived two hours late."),
    ("Drink plenty of water when you exercise in hot weather.", "Stay hydrated during workouts on hot days."),
    ("The compiler reported a syntax error on line twelve.", "Line 12 failed to compile because of a syntax mistake."),
    ("Heavy rain caused flooding in the river valley.", "The valley by the river flooded after a downpour."),
    ("He forgot his umbrella at the restaurant.", "He left his umbrella behind at the restaurant."),
    ("The museum opens at nine in the morning.", "The doors of the museum open at 9 a.m."),
    ("Photosynthesis turns sunlight into chemical energy in plants.", "Plants convert light from the sun into chemical energy."),
    ("The children built a sandcastle on the beach.", "Kids made a castle out of sand at the seaside."),
    ("Please restart your computer to finish installing the update.", "A reboot is required to complete the software update."),
    ("The recipe calls for two cups of flour and one egg.", "You need two cups of flour and an egg for this recipe."),
    ("The team won the championship in the final minute.", "They clinched the title with a last-minute goal."),
    ("Bees pollinate many of the crops we eat.", "Many food crops depend on bees for pollination."),
    ("The old bridge will be closed for repairs next month.", "Next month the aging bridge shuts for maintenance."),
)


def sentences() -> list[str]:
    """The paraphrase pairs flattened: sentence 2i and 2i+1 are partners."""
    return [s for pair in PARAPHRASE_PAIRS for s in pair]


def gpl3_windows(model, n_windows: int = N_WINDOWS) -> np.ndarray:
    """(n_windows, max_seq_len) token ids: [CLS] + consecutive GPL-3 tokens + [SEP], spread evenly over the text."""
    if not GPL3.is_file():
        raise FileNotFoundError(f"{GPL3} is missing (Debian's base-files package ships it)")
    words = model.word_ids(GPL3.read_text())
    body = model.config.max_seq_len - SPECIAL_TOKENS_PER_SEQUENCE
    stride = (len(words) - body) // max(n_windows - 1, 1)
    rows = [np.concatenate(([CLS_ID], words[i * stride : i * stride + body], [SEP_ID])) for i in range(n_windows)]
    return np.stack(rows)
