"""Honest kernels in the styles people and models write Triton in: grid lambdas over meta, triton.autotune with
triton.Config lists, triton.heuristics, helper @triton.jit functions, tl.constexpr globals, masks with other=,
tl.math, 2-D blocks, tl.sum / tl.max reductions, several kernels launched from one forward, nn.Parameter
weights, autograd.Function wrappers, launcher helpers, typing annotations, multi-line docstrings, a `__main__`
test block. Each is
a full completion for a shipped task and must score 1.0.

HONEST: [(id, task name, code)]
"""

HEADER = "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n"

TUTORIAL_RELU = HEADER + '''

@triton.jit
def relu_kernel(x_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    output = tl.where(x > 0, x, 0.0)
    tl.store(output_ptr + offsets, output, mask=mask)


def triton_relu(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    output = torch.empty_like(x)
    n_elements = output.numel()
    grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
    relu_kernel[grid](x, output, n_elements, BLOCK_SIZE=256)
    return output


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return triton_relu(x)
'''

AUTOTUNE_GELU = HEADER + '''

@triton.autotune(
    configs=[
        triton.Config({"BLOCK_SIZE": 128}, num_warps=4),
        triton.Config({"BLOCK_SIZE": 256}, num_warps=4),
        triton.Config({"BLOCK_SIZE": 1024}, num_warps=8, num_stages=2),
    ],
    key=["n_elements"],
)
@triton.jit
def gelu_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(y_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n_elements = x.numel()
        gelu_kernel[lambda META: (triton.cdiv(n_elements, META["BLOCK_SIZE"]),)](x, y, n_elements)
        return y
'''

HELPER_SILU = HEADER + '''

@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def silu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, x * _sigmoid(x), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = 128

    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        silu_kernel[(triton.cdiv(n, self.block),)](x, out, n, BLOCK=self.block)
        return out
'''

CONSTEXPR_GLOBAL_LEAKY = HEADER + '''
BLOCK_SIZE = tl.constexpr(512)
NUM_WARPS = 4


@triton.jit
def leaky_relu_kernel(x_ptr, out_ptr, n, slope):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.where(x >= 0, x, x * slope), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, negative_slope):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        leaky_relu_kernel[(triton.cdiv(n, 512),)](x, out, n, self.negative_slope, num_warps=NUM_WARPS)
        return out
'''

SOFTMAX_ROWS = HEADER + '''

@triton.jit
def softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0)
    row_start_ptr = input_ptr + row_idx * input_row_stride
    col_offsets = tl.arange(0, BLOCK_SIZE)
    input_ptrs = row_start_ptr + col_offsets
    row = tl.load(input_ptrs, mask=col_offsets < n_cols, other=-float("inf"))
    row_minus_max = row - tl.max(row, axis=0)
    numerator = tl.exp(row_minus_max)
    denominator = tl.sum(numerator, axis=0)
    softmax_output = numerator / denominator
    output_row_start_ptr = output_ptr + row_idx * output_row_stride
    tl.store(output_row_start_ptr + col_offsets, softmax_output, mask=col_offsets < n_cols)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        n_rows, n_cols = x.shape
        BLOCK_SIZE = triton.next_power_of_2(n_cols)
        y = torch.empty_like(x)
        softmax_kernel[(n_rows,)](y, x, x.stride(0), y.stride(0), n_cols, BLOCK_SIZE=BLOCK_SIZE, num_warps=4)
        return y
'''

LAYER_NORM_PARAMS = HEADER + '''

@triton.jit
def layer_norm_fwd(X, Y, W, B, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    """One program per row: mean and variance in fp32, then the affine map."""
    row = tl.program_id(0)
    X += row * stride
    Y += row * stride
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / N
    rstd = 1 / tl.sqrt(var + eps)
    w = tl.load(W + cols, mask=mask)
    b = tl.load(B + cols, mask=mask)
    tl.store(Y + cols, xc * rstd * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n))
        self.eps = 1e-5

    def forward(self, x):
        x_arg = x.reshape(-1, x.shape[-1])
        M, N = x_arg.shape
        y = torch.empty_like(x_arg)
        layer_norm_fwd[(M,)](x_arg, y, self.weight, self.bias, x_arg.stride(0), N, self.eps,
                             BLOCK_SIZE=triton.next_power_of_2(N))
        return y.view_as(x)
'''

RMS_NORM_MATH = HEADER + '''

@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0, eviction_policy="evict_last")
    ms = tl.sum(x * x, axis=0) / n_cols
    r = tl.math.rsqrt(ms + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * n_cols + cols, x * r * w, mask=mask)


class ModelNew(nn.Module):
    """RMSNorm with a learned weight."""

    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = 1e-6

    def forward(self, x):
        assert x.is_contiguous(), "x must be contiguous"
        rows, cols = x.shape
        out = torch.empty_like(x)
        rms_norm_kernel[(rows,)](x, self.weight, out, cols, self.eps, BLOCK_N=triton.next_power_of_2(cols))
        return out
'''

MATMUL_AUTOTUNE_2D = HEADER + '''

@triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, num_warps=4),
        triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16}, num_warps=4),
    ],
    key=["M", "N", "K"],
)
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        M, K = a.shape
        K2, N = b.shape
        assert K == K2, "incompatible dimensions"
        c = torch.empty((M, N), device=a.device, dtype=torch.float32)
        grid = lambda META: (triton.cdiv(M, META["BLOCK_M"]), triton.cdiv(N, META["BLOCK_N"]))
        matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                            c.stride(0), c.stride(1))
        return c
'''

LINEAR_RELU_PARAMS = HEADER + '''

@triton.jit
def linear_relu_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, APPLY_RELU: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc += tl.dot(x, w, input_precision="ieee")
    acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    if APPLY_RELU:
        acc = tl.maximum(acc, 0.0)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        M, K = x.shape
        N = self.linear.weight.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        linear_relu_kernel[(triton.cdiv(M, 16), triton.cdiv(N, 16))](
            x, self.linear.weight, self.linear.bias, y, M, N, K, BM=16, BN=16, BK=16, APPLY_RELU=True)
        return y
'''

ROW_SUM_2D = HEADER + '''

@triton.jit
def row_sum_kernel(x_ptr, out_ptr, M, N, stride_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + rows, tl.sum(x, axis=1), mask=rows < M)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        M, N = x.shape
        out = torch.empty(M, device=x.device, dtype=x.dtype)
        grid = (triton.cdiv(M, 4),)
        row_sum_kernel[grid](x, out, M, N, x.stride(0), BLOCK_M=4, BLOCK_N=triton.next_power_of_2(N))
        return out
'''

ROW_MAX_LOOP = HEADER + '''

@triton.jit
def row_max_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.full((BLOCK,), float("-inf"), tl.float32)
    for start in tl.range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc = tl.maximum(acc, tl.load(x_ptr + row * N + cols, mask=cols < N, other=float("-inf")))
    tl.store(out_ptr + row, tl.max(acc, axis=0))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = x.new_empty(x.shape[0])
        row_max_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=16)
        return out
'''

TOTAL_SUM_TWO_PASS = HEADER + '''

@triton.jit
def partial_sum_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(partial_ptr + pid, tl.sum(x, axis=0))


@triton.jit
def final_sum_kernel(partial_ptr, out_ptr, num_partials, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    p = tl.load(partial_ptr + offs, mask=offs < num_partials, other=0.0)
    tl.store(out_ptr, tl.sum(p, axis=0))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous().view(-1)
        n = x.numel()
        num_partials = triton.cdiv(n, 64)
        partials = torch.empty(num_partials, device=x.device, dtype=torch.float32)
        partial_sum_kernel[(num_partials,)](x, partials, n, BLOCK=64)
        out = torch.empty((), device=x.device, dtype=x.dtype)
        final_sum_kernel[(1,)](partials, out, num_partials, BLOCK=triton.next_power_of_2(num_partials))
        return out
'''

COL_SUM_2D = HEADER + '''

@triton.jit
def col_sum_kernel(x_ptr, out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for m in range(0, M, BLOCK_M):
        rows = m + tl.arange(0, BLOCK_M)
        tile = tl.load(x_ptr + rows[:, None] * N + cols[None, :],
                       mask=(rows[:, None] < M) & (cols[None, :] < N), other=0.0)
        acc += tl.sum(tile, axis=0)
    tl.store(out_ptr + cols, acc, mask=cols < N)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        M, N = x.shape
        out = torch.empty(N, dtype=x.dtype, device=x.device)
        col_sum_kernel[lambda meta: (triton.cdiv(N, meta["BLOCK_N"]),)](x, out, M, N, BLOCK_M=8, BLOCK_N=32)
        return out
'''

CROSS_ENTROPY_TWO_KERNELS = HEADER + '''

@triton.jit
def row_loss_kernel(logits_ptr, targets_ptr, loss_ptr, V, stride, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_V)
    logits = tl.load(logits_ptr + row * stride + cols, mask=cols < V, other=-float("inf")).to(tl.float32)
    m = tl.max(logits, axis=0)
    lse = m + tl.log(tl.sum(tl.exp(logits - m), axis=0))
    target = tl.load(targets_ptr + row)
    picked = tl.load(logits_ptr + row * stride + target).to(tl.float32)
    tl.store(loss_ptr + row, lse - picked)


@triton.jit
def mean_kernel(loss_ptr, out_ptr, M, BLOCK_M: tl.constexpr):
    offs = tl.arange(0, BLOCK_M)
    total = tl.sum(tl.load(loss_ptr + offs, mask=offs < M, other=0.0), axis=0)
    tl.store(out_ptr, total / M)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits, targets):
        M, V = logits.shape
        losses = torch.empty(M, device=logits.device, dtype=torch.float32)
        row_loss_kernel[(M,)](logits, targets, losses, V, logits.stride(0), BLOCK_V=triton.next_power_of_2(V))
        out = torch.empty((), device=logits.device, dtype=logits.dtype)
        mean_kernel[(1,)](losses, out, M, BLOCK_M=triton.next_power_of_2(M))
        return out
'''

CUMSUM_BUILTIN = HEADER + '''

@triton.jit
def cumsum_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + row * N + offs, tl.cumsum(x, axis=0), mask=offs < N)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        cumsum_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
'''

CUMPROD_SCAN_COMBINE = HEADER + '''

@triton.jit
def mul_combine(a, b):
    return a * b


@triton.jit
def cumprod_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + offs, mask=offs < N, other=1.0)
    y = tl.associative_scan(x, axis=0, combine_fn=mul_combine)
    tl.store(y_ptr + row * N + offs, y, mask=offs < N)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        M, N = x.shape
        cumprod_kernel[(M,)](x, y, N, BLOCK=triton.next_power_of_2(N))
        return y
'''

ADD_SCALED_INIT_SCALAR = HEADER + '''

@triton.jit
def add_scaled_kernel(x_ptr, y_ptr, out_ptr, alpha, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + alpha * y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n_elements = out.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        add_scaled_kernel[grid](x, y, out, self.alpha, n_elements, BLOCK_SIZE=1024)
        return out
'''

CLAMP_HEURISTICS = HEADER + '''

@triton.heuristics({"EVEN_N": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def clamp_kernel(x_ptr, out_ptr, n, lo, hi, BLOCK: tl.constexpr, EVEN_N: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN_N:
        x = tl.load(x_ptr + offs)
        tl.store(out_ptr + offs, tl.minimum(tl.maximum(x, lo), hi))
    else:
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, tl.minimum(tl.maximum(x, lo), hi), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, lo, hi):
        super().__init__()
        self.lo, self.hi = lo, hi

    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        clamp_kernel[(triton.cdiv(n, 256),)](x, out, n, self.lo, self.hi, BLOCK=256)
        return out
'''

LOG_SOFTMAX_MATH = HEADER + '''

@triton.jit
def log_softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=float("-inf"))
    z = x - tl.max(x, axis=0)
    log_denominator = tl.math.log(tl.sum(tl.math.exp(z), axis=0))
    tl.store(y_ptr + row * n_cols + cols, z - log_denominator, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        n_rows, n_cols = x.shape
        y = torch.empty_like(x)
        log_softmax_kernel[(n_rows, 1, 1)](x, y, n_cols, BLOCK=triton.next_power_of_2(n_cols))
        return y
'''

SWIGLU_THREE_KERNELS = HEADER + '''

@triton.jit
def matmul_nt_kernel(x_ptr, w_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        rk = k + tl.arange(0, BK)
        a = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def silu_mul_kernel(g_ptr, u_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask)
    u = tl.load(u_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, g * tl.sigmoid(g) * u, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def _project(self, x, w):
        M, K = x.shape
        N = w.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=torch.float32)
        matmul_nt_kernel[(triton.cdiv(M, 16), triton.cdiv(N, 16))](x, w, y, M, N, K, BM=16, BN=16, BK=16)
        return y

    def forward(self, x):
        gate = self._project(x, self.w1.weight)
        up = self._project(x, self.w3.weight)
        out = torch.empty_like(gate)
        silu_mul_kernel[(triton.cdiv(gate.numel(), 256),)](gate, up, out, gate.numel(), BLOCK=256)
        return out
'''

INT_AFFINE = HEADER + '''

@triton.jit
def int_affine_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0)
    y = tl.load(y_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, 3 * x + y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        out = torch.empty_like(x)
        int_affine_kernel[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
        return out
'''

STRING_CONSTEXPR_ACTIVATION = HEADER + '''

@triton.jit
def hardswish(x):
    return x * tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0) / 6.0


@triton.jit
def activation_kernel(x_ptr, out_ptr, n, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if ACTIVATION == "hardswish":
        y = hardswish(x)
    else:
        y = x
    tl.store(out_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.activation = "hardswish"

    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        activation_kernel[(triton.cdiv(n, 128),)](x, out, n, ACTIVATION=self.activation, BLOCK=128)
        return out
'''

BIAS_ADD_STRIDES = HEADER + '''

@triton.jit
def bias_add_kernel(x_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_om, BLOCK_N: tl.constexpr):
    """
    Adds a bias row to every row of x.

    One program per row; columns in one block.
    """
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask)
    b = tl.load(b_ptr + cols, mask=mask)
    tl.store(out_ptr + row * stride_om + cols, x + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(n))

    def forward(self, x):
        M, N = x.shape
        out = torch.empty_like(x)
        bias_add_kernel[(M,)](x, self.bias, out, M, N, x.stride(0), out.stride(0), BLOCK_N=triton.next_power_of_2(N))
        return out


if __name__ == "__main__":
    model = ModelNew(90)
    x = torch.randn(7, 90)
    print("max error:", (model(x) - (x + model.bias)).abs().max().item())
'''

AUTOGRAD_FUNCTION_TANH = """import torch
from torch import nn
import triton
from triton import language as tl


@triton.jit
def tanh_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    tl.store(y_ptr + offs, tl.where(x >= 0, t, -t), mask=mask)


class TritonTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.empty_like(x)
        n = x.numel()
        ctx.n = n
        tanh_kernel[(triton.cdiv(n, 256),)](x, y, n, BLOCK=256)
        return y


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x):
        return TritonTanh.apply(x.contiguous())
"""

SOFTPLUS_STATIC_RANGE = HEADER + '''

@triton.jit
def softplus_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    base = tl.program_id(0) * BLOCK * UNROLL
    for u in tl.static_range(UNROLL):
        offs = base + u * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        y = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
        tl.store(y_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._block = 128
        self._unroll = 2

    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        step = self._block * self._unroll
        softplus_kernel[(triton.cdiv(n, step),)](x, y, n, BLOCK=self._block, UNROLL=self._unroll)
        return y
'''

WHERE_POSITIVE_NUM_PROGRAMS = HEADER + '''

@triton.jit
def where_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    for start in range(pid * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, tl.where(x > 0, x, y), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        out = torch.empty_like(x)
        n = x.numel()
        where_kernel[(min(4, triton.cdiv(n, 64)),)](x, y, out, n, BLOCK=64)
        return out
'''

TYPING_ANNOTATIONS = """import torch
import torch.nn as nn
import triton
import triton.language as tl
from typing import Optional, Tuple


@triton.jit
def squared_diff_kernel(x_ptr, y_ptr, out_ptr, n_elements: int, BLOCK_SIZE: tl.constexpr = 512):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    d = tl.load(x_ptr + offsets, mask=mask) - tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, d * d, mask=mask)


def squared_diff(x: torch.Tensor, y: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    if out is None:
        out = torch.empty_like(x)
    n_elements = x.numel()
    grid: Tuple[int] = (triton.cdiv(n_elements, 512),)
    squared_diff_kernel[grid](x, y, out, n_elements)
    return out


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return squared_diff(x.contiguous(), y.contiguous())
"""

HONEST = [
    ("tutorial_grid_lambda_launcher", "relu", TUTORIAL_RELU),
    ("autotune_config_list", "gelu", AUTOTUNE_GELU),
    ("helper_jit_function", "silu", HELPER_SILU),
    ("constexpr_global", "leaky_relu", CONSTEXPR_GLOBAL_LEAKY),
    ("softmax_tutorial_rows", "softmax_rows", SOFTMAX_ROWS),
    ("layer_norm_parameters", "layer_norm", LAYER_NORM_PARAMS),
    ("rms_norm_tl_math_eviction", "rms_norm", RMS_NORM_MATH),
    ("matmul_autotune_2d_grid", "matmul", MATMUL_AUTOTUNE_2D),
    ("linear_relu_nn_linear_weights", "linear_relu", LINEAR_RELU_PARAMS),
    ("row_sum_2d_block", "row_sum", ROW_SUM_2D),
    ("row_max_tl_range_loop", "row_max", ROW_MAX_LOOP),
    ("total_sum_two_kernels", "total_sum", TOTAL_SUM_TWO_PASS),
    ("col_sum_grid_lambda_2d", "col_sum", COL_SUM_2D),
    ("cross_entropy_two_kernels", "cross_entropy", CROSS_ENTROPY_TWO_KERNELS),
    ("cumsum_tl_cumsum", "cumsum", CUMSUM_BUILTIN),
    ("cumprod_associative_scan", "cumprod", CUMPROD_SCAN_COMBINE),
    ("add_scaled_init_scalar", "add_scaled", ADD_SCALED_INIT_SCALAR),
    ("clamp_heuristics", "clamp", CLAMP_HEURISTICS),
    ("log_softmax_tl_math", "log_softmax", LOG_SOFTMAX_MATH),
    ("swiglu_three_kernels", "swiglu", SWIGLU_THREE_KERNELS),
    ("int_affine", "int_affine", INT_AFFINE),
    ("string_constexpr_activation", "hardswish", STRING_CONSTEXPR_ACTIVATION),
    ("bias_add_docstring_main_block", "bias_add", BIAS_ADD_STRIDES),
    ("autograd_function_from_imports", "tanh", AUTOGRAD_FUNCTION_TANH),
    ("softplus_static_range_private_attrs", "softplus", SOFTPLUS_STATIC_RANGE),
    ("where_num_programs_persistent", "where_positive", WHERE_POSITIVE_NUM_PROGRAMS),
    ("typing_annotations_kernel_default", "squared_diff", TYPING_ANNOTATIONS),
]
