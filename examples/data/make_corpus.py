"""Write the examples' text corpus: short generated stories, one JSON record per line.

    python examples/data/make_corpus.py            # rewrites examples/data/corpus/train.jsonl

The examples train on it through a ``train`` channel (``fit(inputs={"train": ...})``). The text
is generated from a small grammar by a fixed linear congruential generator, so the same file
comes out on every machine and Python version (tests/examples/test_corpus.py checks that the
file in the repository is this script's output). It is small (about 100 KB) and regular enough
that a tiny model's loss falls within a few dozen steps, byte by byte.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent / "corpus" / "train.jsonl"
DOCUMENTS = 400

NAMES = ["Ada", "Ben", "Cleo", "Dev", "Esme", "Finn", "Gus", "Hana", "Ivo", "Juno"]
ANIMALS = ["cat", "dog", "fox", "owl", "hen", "frog", "goat", "crow", "mole", "bee"]
ADJECTIVES = ["small", "brave", "quiet", "old", "quick", "sleepy", "kind", "bright", "shy"]
PLACES = ["the river", "the hill", "the barn", "the garden", "the forest", "the market",
          "the well", "the bridge"]
THINGS = ["a red ball", "a blue kite", "an old map", "a warm loaf", "a silver key",
          "a green apple", "a small boat", "a long rope"]
VERBS = ["found", "lost", "carried", "painted", "hid", "shared", "mended", "watched"]
ENDINGS = ["and everyone was happy.", "and they went home for tea.",
           "and the sun went down.", "and it began to rain.", "and the day was over."]


class Lcg:
    """A 32-bit linear congruential generator (Numerical Recipes' constants): the same numbers
    everywhere, unlike `random`'s methods, whose algorithms may change between versions."""

    def __init__(self, seed: int) -> None:
        self.state = seed

    def below(self, n: int) -> int:
        self.state = (1664525 * self.state + 1013904223) % 2**32
        return (self.state >> 8) % n

    def pick(self, options: list[str]) -> str:
        return options[self.below(len(options))]


def story(rng: Lcg) -> str:
    name, animal = rng.pick(NAMES), rng.pick(ANIMALS)
    sentences = [f"{name} had a {rng.pick(ADJECTIVES)} {animal}."]
    for _ in range(2 + rng.below(4)):
        sentences.append(f"One day the {animal} {rng.pick(VERBS)} {rng.pick(THINGS)} near "
                         f"{rng.pick(PLACES)}.")
    sentences.append(f"{name} smiled, {rng.pick(ENDINGS)}")
    return " ".join(sentences)


def corpus_lines() -> list[str]:
    rng = Lcg(2026)
    return [json.dumps({"text": story(rng)}) for _ in range(DOCUMENTS)]


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(corpus_lines()) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {DOCUMENTS} documents)")


if __name__ == "__main__":
    main()
