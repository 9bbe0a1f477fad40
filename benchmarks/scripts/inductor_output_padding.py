"""What Inductor does with a vocabulary projection's output in inference: its strides and peak,
against eager, the padded product alone and the padded product copied out to eager's layout.

    PYTHONPATH=. python benchmarks/scripts/inductor_output_padding.py

BERT's (30522 x 768) and GPT-2's (50257 x 1024) heads at 4096 rows, bf16, with a bias, no_grad.
The GPU only.
"""

import torch
import torch.nn.functional as F
from triton.testing import do_bench


def main() -> None:
    for vocab, width in ((30522, 768), (50257, 1024)):
        h = torch.randn(4096, width, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(vocab, width, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(vocab, device="cuda", dtype=torch.bfloat16)
        compiled = torch.compile(F.linear)
        with torch.no_grad():
            compiled(h, w, b)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            out = compiled(h, w, b)
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            inductor = do_bench(lambda: compiled(h, w, b))
            print(vocab, "Inductor: output stride", out.stride(), "peak MiB", round(peak, 1), "ms", round(inductor, 3))
            print(vocab, "eager ms", round(do_bench(lambda: F.linear(h, w, b)), 3))
            extra = -vocab % 8
            wp, bp = F.pad(w, (0, 0, 0, extra)), F.pad(b, (0, extra))
            padded = do_bench(lambda: F.linear(h, wp, bp))
            copied = do_bench(lambda: F.linear(h, wp, bp)[:, :vocab].contiguous())
            print(vocab, "padded ms", round(padded, 3), "padded + copy-out ms", round(copied, 3))


if __name__ == "__main__":
    main()
