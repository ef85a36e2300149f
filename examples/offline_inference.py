"""Offline inference with DeepInfer (the original release's entry point).

    python examples/offline_inference.py                         # the default checkpoint
    python examples/offline_inference.py --model deepinfer/tiny-v41  # embedded tiny V4.1, no download, no download

The default model is deepseek-ai/DeepSeek-V4.1-Flash-1017 from the Hugging Face hub; pass a
local directory with --model when the machine is offline.
"""
from __future__ import annotations

import argparse

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.hub import DEFAULT_MODEL


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()

    prompts = [
        "Hello, my name is",
        "The president of the United States is",
        "The capital of France is",
        "The future of AI is",
    ]
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=args.max_tokens, seed=0)
    llm = LLM(model=args.model)
    for out in llm.generate(prompts, sampling_params):
        print(f"Prompt: {out.prompt!r}, Generated text: {out.outputs[0].text!r}")
    chat = llm.chat([{"role": "user", "content": "Write one sentence about the sea."}],
                    SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
    print(f"Chat reply: {chat[0].outputs[0].text!r}")


if __name__ == "__main__":
    main()
