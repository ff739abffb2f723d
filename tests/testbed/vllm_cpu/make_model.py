"""Makes the testbed's tiny model, deterministically, without the hub: run INSIDE the real vLLM
CPU image (its torch, transformers and tokenizers) as `python3 make_model.py OUT_DIR`.

A 2-layer LlamaForCausalLM (hidden 256, 4 heads, 2 KV heads, head_dim 64) with seeded random
weights saved as safetensors, and a byte-level BPE tokenizer trained here on generated text,
with a chat template. Its output is gibberish, but greedy output is deterministic, which is what
pdboot's correctness gate compares; the same seed gives the same bytes on every build.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one thread: the BPE merges never race

SEED = 1234
VOCAB = 1024
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
WORDS = (
    "the a prefill decode engine router cache block token transfer node host model layer "
    "request reply hello world nixl ucx memory core thread queue batch prompt answer fast slow "
    "one two three four five six seven eight nine ten zero kv pd vllm cpu gpu"
)


def corpus(n: int) -> list[str]:
    rnd = random.Random(SEED)
    lines = []
    for _ in range(n):
        words = [rnd.choice(WORDS.split()) for _ in range(rnd.randint(3, 16))]
        lines.append(" ".join(words) + rnd.choice([".", "!", "?", ","]))
    lines += [f"<|user|>\n{x}\n<|assistant|>\n" for x in lines[:200]]
    return lines


def tokenizer(out: Path) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(4000), trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": BOS,
                "eos_token": EOS,
                "pad_token": PAD,
                "add_bos_token": False,
                "model_max_length": 16384,
                "clean_up_tokenization_spaces": False,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, indent=1, sort_keys=True)
        + "\n"
    )
    return {
        "vocab": tok.get_vocab_size(),
        "bos": tok.token_to_id(BOS),
        "eos": tok.token_to_id(EOS),
        "pad": tok.token_to_id(PAD),
    }


def model(out: Path, ids: dict[str, int]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    cfg = LlamaConfig(
        vocab_size=ids["vocab"],
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=16384,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    m = LlamaForCausalLM(cfg)
    m.save_pretrained(str(out), safe_serialization=True)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    model(out, tokenizer(out))
    print("model files:", ", ".join(sorted(p.name for p in out.iterdir())))


if __name__ == "__main__":
    main()
