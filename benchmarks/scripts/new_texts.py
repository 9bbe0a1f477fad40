"""Which kernels make new Triton text at each new sequence length (issue #42).

    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/scripts/new_texts.py train 40,41,42,43,47,48,49,56
    PYTHONPATH=. python benchmarks/scripts/new_texts.py train 500,501,502,503,504,505 --gpu
    ... --no-probe: config "probe_sizes" off (no probe size before the dynamic graph's first)

transformers' Llama through `torch.compile(backend="minicomp")` (CPU: hidden 64, 1 layer, batch 2,
float32; `--gpu`: d2048, GQA 16/4, 2 layers, batch 4, bf16), one step (`train`: loss and backward;
`infer`: no_grad logits) a length. Per length: the kernel families made (a skeleton not seen before:
new text) and widened (a family's template rewritten: new text too) (codegen/families.py); from the
third length on, each new family's name and the first lines where its skeleton differs from the
closest one seen before (marked sizes blanked out: `«64»` reads as an empty place). At the end, for
the families first made after the first length (by the dynamic graph): the literal positions that
came to vary (runtime sizes) against those a rule "a multiple of the length at the family's first
member" would flag (flagged and varying, flagged but constant, varying but not flagged).
"""

from __future__ import annotations

import difflib
import os
import sys
import tempfile

import torch

from minicomp.codegen import families


class Recorder:
    """Families made and widened, by wrapping `Families._find` and `Family.widen`."""

    def __init__(self):
        self.made: list[tuple[str, list[str], list[str]]] = []  # (kernel, closest skeleton, its skeleton)
        self.widened = 0
        self.born: list[tuple[families.Family, int]] = []  # (family, the length it was made at)
        self.length = 0
        find, widen, init = families.Families._find, families.Family.widen, families.Family.__init__
        recorder = self

        def recording_init(self, *args, **kwargs):
            init(self, *args, **kwargs)
            recorder.born.append((self, recorder.length))

        def recording_find(self, source, between):
            found = find(self, source, between)
            if found is None:
                text = "".join(between)
                closest = max(
                    (key[2] for key in self._families),
                    key=lambda other: difflib.SequenceMatcher(None, "".join(other), text).quick_ratio(),
                    default=(),
                )
                recorder.made.append((source.name, list(closest), list(between)))
            return found

        def recording_widen(self, literals):
            recorder.widened += 1
            return widen(self, literals)

        families.Families._find = recording_find
        families.Family.widen = recording_widen
        families.Family.__init__ = recording_init

    def positions(self, first_length: int) -> str:
        """The rule's hits and misses over the families made after `first_length`."""
        hit = constant = missed = made = 0
        for family, length in self.born:
            if length == first_length:
                continue
            made += 1
            varying = {p for group in family.groups for p in group}
            flagged = {p for p, v in enumerate(family.first) if v >= length and v % length == 0}
            hit, constant, missed = (
                hit + len(varying & flagged),
                constant + len(flagged - varying),
                missed + len(varying - flagged),
            )
        return (
            f"families made after L={first_length}: {made}; positions flagged and varying {hit}, "
            f"flagged but constant {constant}, varying but not flagged {missed}"
        )

    def reset(self):
        self.made, self.widened = [], 0


def main(argv: list[str]) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from minicomp import config as minicomp_config
    from minicomp.dispatch.dynamo import registered

    mode, lengths, gpu = argv[0], [int(x) for x in argv[1].split(",")], "--gpu" in argv
    minicomp_config.DEFAULTS["probe_sizes"] = "--no-probe" not in argv  # (this process's default: every thread's)
    hidden, heads, kv_heads, batch, layers = (2048, 16, 4, 4, 2) if gpu else (64, 4, 2, 2, 1)
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_hidden_layers=layers,
        vocab_size=128,
        max_position_embeddings=4096,
        use_cache=False,
    )
    model = LlamaForCausalLM(config)
    device = "cuda" if gpu else "cpu"
    if gpu:
        model = model.to(device, torch.bfloat16)
    os.environ["MINICOMP_CACHE_DIR"] = tempfile.mkdtemp()
    compiled = torch.compile(model, backend=registered())
    recorder = Recorder()
    for i, length in enumerate(lengths):
        recorder.reset()
        recorder.length = length
        ids = torch.randint(0, 128, (batch, length), device=device)
        if mode == "train":
            model.zero_grad()
            compiled(input_ids=ids, labels=ids).loss.backward()
        else:
            with torch.no_grad():
                compiled(input_ids=ids)
        print(f"L={length}: new families {len(recorder.made)}, widened {recorder.widened}", flush=True)
        if i < 2:
            continue
        for name, closest, between in recorder.made:
            print("  NEW", name)
            diff = difflib.unified_diff("".join(closest).splitlines(), "".join(between).splitlines(), lineterm="", n=0)
            for line in list(diff)[2:10]:
                print("     ", line[:160])
    print(recorder.positions(lengths[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
