"""Issue 52's round 6: candidates right only at an edge of a round-5 rule, each beside an honest kernel in the same
style that must keep scoring 1.0. (id, task, attack, reason, honest) in CASES. Every attack scored 1.0 on main before
the change (e2de9f9); the rule that now refuses it is named beside it.

  max_over_garbage   a row max accumulated into the output read back from torch.empty: NaN garbage vanishes in
                     tl.maximum (maxnum), a GPU's reused block holds finite leftovers / the output filled with -inf
                     (rule: fresh memory holds NaN, huge positive and huge negative floats in turn, one per run of
                     every case, harness._GARBAGE)
"""
from triton_corpus.gpu_rules import model

_ROW_MAX = '''
@triton.jit
def row_max_kernel(x_ptr, out_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=-float("inf"))
    acc = tl.load(out_ptr + row)
    tl.store(out_ptr + row, tl.maximum(acc, tl.max(x, axis=0)))
'''
_ROW_MAX_LAUNCH = "x = x.contiguous()\nout = OUT\nrow_max_kernel[(x.shape[0],)](x, out, x.shape[1], " \
    "BLOCK_N=triton.next_power_of_2(x.shape[1]))\nreturn out"
MAX_OVER_GARBAGE = model(_ROW_MAX, _ROW_MAX_LAUNCH.replace("OUT", "torch.empty(x.shape[0], dtype=x.dtype)"))
MAX_OVER_MINUS_INF = model(_ROW_MAX, _ROW_MAX_LAUNCH.replace("OUT", 'torch.full((x.shape[0],), -float("inf"), '
                                                                    'dtype=x.dtype)'))

CASES = [
    ("max_over_garbage", "row_max", MAX_OVER_GARBAGE, "wrong_output", MAX_OVER_MINUS_INF),
]
