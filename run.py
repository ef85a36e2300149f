"""Run DeepInfer on the selected accelerator.

    DEEPINFER_ACCELERATOR=ascend python run.py          # fails clearly without deepinfer-ascend / torch_npu / an NPU
    python run.py --model deepinfer/tiny-v41 --prompt "Hello"

The platform is chosen from DEEPINFER_ACCELERATOR (cpu, nvidia, ascend, or any installed plugin),
else the single detected platform, else the CPU.
"""
from __future__ import annotations

import argparse
import sys

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.hub import DEFAULT_MODEL
from deepinfer_core.platform import PlatformNotAvailableError, current_platform


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--prompt", action="append", default=None)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    try:
        platform = current_platform()
    except PlatformNotAvailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"platform: {platform.name} ({platform.device()})")
    llm = LLM(model=args.model, platform=platform)
    prompts = args.prompt or ["Hello, my name is", "The capital of France is"]
    for out in llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.max_tokens)):
        print(f"Prompt: {out.prompt!r}\nGenerated: {out.outputs[0].text!r}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
