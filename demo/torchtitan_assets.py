"""Local assets for TorchTitan's llama3 debug model, which the torchtitan wheel does not ship: a byte-level
BPE tokenizer (vocab 2048, the debug model's) under ``tests/assets/tokenizer`` and a JSON-lines text corpus
under ``tests/assets/c4_test`` (field ``text``), both made from the Python standard library's own sources, so
nothing is downloaded. ``python demo/torchtitan_assets.py <dir>`` writes them below ``<dir>``."""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 2048
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def corpus(n: int = 2000) -> list[str]:
    """Chunks of ~2 KB of text from the standard library's sources (stable, always present)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(errors="ignore")
        texts += [text[i:i + 2000] for i in range(0, len(text), 2000)]
        if len(texts) >= n:
            break
    return texts[:n]


def main(root: Path) -> None:
    texts = corpus()
    data = root / "tests" / "assets" / "c4_test"
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "data.json", "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    out = root / "tests" / "assets" / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    print(f"wrote {len(texts)} documents and a {tok.get_vocab_size()}-token tokenizer under {root / 'tests/assets'}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
