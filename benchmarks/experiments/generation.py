"""Text generation with transformers' default (dynamic) KV cache, token by token (issue #42).

    python -m benchmarks.experiments.generation OUT.json [--models llama,gpt2] [--tokens 64]
                                                [--prompt 128] [--variants eager,inductor,minicomp,minicomp-per-size]
    TRITON_INTERPRET=1 python -m benchmarks.experiments.generation OUT.json --tiny

A suite language model (minicomp/bench/model_specs.py: 2 layers at real widths, bf16 on the GPU;
`--tiny`: its tiny sizes, float32 on the CPU, Llama alone unless `--models`, a smoke run whose
numbers mean nothing), greedy decoding of `--tokens` tokens after a prompt of `--prompt`, the model
called once a token with a `DynamicCache` (the cache grows by one position a call: from the third
call Dynamo's graph is dynamic in its length). Each variant runs in this process after
`torch._dynamo.reset()` with a fresh minicomp cache. Per token: the call's wall seconds
(synchronized), and for minicomp the graphs it compiled during the call (pipeline runs). Variant
`minicomp-per-size` never cuts a dynamic graph into static parts (capture/static_parts.py), so it
compiles each length. Per variant: the prompt's and the first three tokens' seconds, the median and
largest of the rest, the compiles after the third token (issue #42's goal: none), the generated
tokens' agreement with eager's, and `steady_ms`: the median of 20 more calls at the last length
(each on a copy of the cache, after 3 warm-up calls; `--tiny`: 2 after 1).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import statistics
import tempfile
import time

import torch

from minicomp.bench import model_specs as ms

# minicomp's variants: their torch.compile options ("per-size": a dynamic graph compiled per
# size, never cut into static parts: the specialized code the static parts are measured against)
VARIANTS = {"minicomp": {}, "minicomp-per-size": {"static_share": 2.0}}


def _counting_compiles() -> list:
    from minicomp.dispatch import dynamo

    names, compile_graph = [], dynamo.compile_graph

    def counting(gm, name="fn", *args, **kwargs):
        names.append(name)
        return compile_graph(gm, name, *args, **kwargs)

    dynamo.compile_graph = counting
    return names


def generate(model, variant: str, prompt: torch.Tensor, tokens: int, compiles: list, steady_calls=(3, 20)) -> dict:
    """One variant's generation; `steady_calls`: (warm-up, timed) calls of `_steady`."""
    import transformers

    from minicomp.dispatch.dynamo import registered

    torch._dynamo.reset()
    os.environ["MINICOMP_CACHE_DIR"] = tempfile.mkdtemp()
    fn = model
    if variant == "inductor":
        fn = torch.compile(model, backend="inductor")
    elif variant in VARIANTS:
        fn = torch.compile(model, backend=registered(), options=VARIANTS[variant])
    cache = transformers.DynamicCache(config=model.config)
    token, seconds, compiled, out = prompt, [], [], []
    with torch.no_grad():
        for _ in range(tokens + 1):  # the prompt, then one call a new token
            before = len(compiles)
            _sync()
            start = time.perf_counter()
            logits = fn(input_ids=token, past_key_values=cache, use_cache=True).logits
            _sync()
            seconds.append(time.perf_counter() - start)
            compiled.append(len(compiles) - before)
            token = logits[:, -1:].argmax(-1)
            out.append(int(token))
        steady = _steady(fn, token, cache, *steady_calls)
    later = seconds[4:]
    return dict(
        variant=variant,
        prompt_s=round(seconds[0], 4),
        first_tokens_s=[round(s, 4) for s in seconds[1:4]],
        later_median_ms=round(statistics.median(later) * 1e3, 3) if later else None,
        later_max_ms=round(max(later) * 1e3, 3) if later else None,
        compiles_after_third_token=sum(compiled[4:]),
        steady_ms=steady,
        compiles=compiled,
        tokens=out,
    )


def _steady(fn, token: torch.Tensor, cache, warm: int = 3, reps: int = 20) -> float:
    """Median ms of one more token at one fixed cache length, each call on its own copy of the
    cache (made outside the timing), after `warm` calls: the steady state of code compiled for that
    length (per size) against the static parts' (every length)."""
    seconds = []
    for i in range(warm + reps):
        copied = copy.deepcopy(cache)
        _sync()
        start = time.perf_counter()
        fn(input_ids=token, past_key_values=copied, use_cache=True)
        _sync()
        if i >= warm:
            seconds.append(time.perf_counter() - start)
    return round(statistics.median(seconds) * 1e3, 3)


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="where the JSON results go")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes, CPU, 6 tokens, llama alone: a smoke run")
    parser.add_argument("--models", default="llama,gpt2")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--variants", default="eager,inductor,minicomp,minicomp-per-size")
    args = parser.parse_args(argv)
    device, dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
    if args.tiny:
        if os.environ.get("TRITON_INTERPRET") != "1":
            parser.error("--tiny runs on the CPU through Triton's interpreter: set TRITON_INTERPRET=1")
        device, dtype, args.tokens, args.prompt, args.variants = "cpu", torch.float32, 6, 5, "eager,minicomp"
        args.models = "llama" if args.models == parser.get_default("models") else args.models
    compiles = _counting_compiles()
    rows = []
    for name in args.models.split(","):
        spec = ms.MODELS[name]
        sizes = spec.sizes(args.tiny)
        model = ms.build_task(spec, importlib.import_module(spec.library), sizes, "infer", device, dtype).model.inner
        prompt = torch.randint(sizes.vocab, (1, args.prompt), generator=torch.Generator().manual_seed(0)).to(device)
        for variant in args.variants.split(","):
            steady = (1, 2) if args.tiny else (3, 20)
            row = dict(model=name, device=device, **generate(model, variant, prompt, args.tokens, compiles, steady))
            print(json.dumps({k: v for k, v in row.items() if k not in ("tokens", "compiles")}), flush=True)
            rows.append(row)
        eager = next((r["tokens"] for r in rows if r["model"] == name and r["variant"] == "eager"), None)
        for r in rows:
            if r["model"] == name and eager is not None:
                r["same_tokens_as_eager"] = sum(a == b for a, b in zip(r["tokens"], eager))
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (--tiny: not a measurement)"
    with open(args.out, "w") as f:
        json.dump(dict(device=name, settings=vars(args), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
