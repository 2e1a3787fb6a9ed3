"""CUDA path: split-KV GQA decode attention in TileLang, built from one frozen Plan.

A ``Plan`` (resolved once per shape by run_kernel._cuda_plan) says which of four kernels a call runs and how; the
builders here turn it into TileLang prim_funcs over shared macros (_decode_body: one CTA's tiles; its epilogues;
_last_cta_macro; _combine_macro):

- ``decode_direct`` (one split): grid (v_split, Hkv, B); each CTA writes O.
- ``decode_split_last`` (uniform splits, merge in the kernel; by default on devices without programmatic dependent
  launch, last_cta_default): grid (num_splits, Hkv, B); each split writes its normalised partial O (fp32) and
  log2-sum-exp, and the last CTA of each (batch, kv head) to finish merges them (an acq_rel arrival counter per
  (batch, kv head), reset by the merging CTA).
- ``decode_split_combine`` (uniform splits, a combine kernel; by default on Hopper, where the combine kernel is
  launched dependent (PDL) and resident while the splits run, and elsewhere for merges of more than
  LAST_CTA_MAX_ROWS partial rows): the split kernel, then the combine kernel (one CTA of d threads per (batch, query
  head)), both launched by one host call.
- ``decode_balanced``: each row split by its own length, read on the device (below).

One CTA owns all G = Hq // Hkv query heads of one KV head (padded to ``block_H`` MMA rows) and a contiguous range
of KV tiles of one sequence. Each K/V tile of ``block_N`` keys is gathered into shared memory once (cp.async,
``T.Pipelined``), QK^T and PV run on the tensor cores through ``T.gemm``, and the softmax is the online exp2 form in
fp32. The key rows of a tile are computed per row, so the same kernel serves a contiguous cache ([B, S, Hkv, D]) and
a paged cache ([num_blocks, page, Hkv, D] + block_table) and any page size; rows past ``cache_seqlens[b]`` are
clamped to the last valid key (always valid memory, no NaN garbage) and masked to -inf.

``eager`` (default when a CTA streams few tiles): Q and the first K tile are issued as one cp.async group addressed
from the allocated cache length (contiguous: the cache's length; paged: the block table's width x page size, page ids
clamped into the pool), before the sequence length L[b] arrives; the split ranges then come from the allocated
length too, and a tile wholly past the sequence is masked (scaled by 0, never by NaN). V rows are clamped to the
sequence. Without eager every row is clamped to the sequence, so its block-table entry is a page of the sequence and
needs no clamp (H200, iteration 7: the clamp on every row of the non-eager path cost paged case 7 about 4 us).

``v_split`` (the default for an unsplit plan of few rows, v_split_default): each (batch, kv head) row runs on two
CTAs (grid x), each computing the whole softmax from all of K and its half of V's and the output's columns, so a grid
of at most half the units' rows streams K + V / 2 bytes a CTA on twice the units, with no merge.

``balanced`` (the default for batches of several rows with a long allocated length, run_kernel's _balanced_splits):
each row is split by its own length, read on the device, so that the batch's real tiles spread over about
BAL_CTAS_PER_SM CTAs per unit (one, with 128-key tiles, from BAL_WIDE_GQA query heads per KV head in a contiguous
cache): with T = kv heads x the sum of the rows' tiles and w = max(BAL_MIN_TILES, ceil(T / target)), row b takes
round(tiles_b / w) splits (1..num_splits). The grid is (kv heads, batch + pool): block y < batch runs the first split
of row y; the pool blocks (pool = ceil(target / kv heads), which bounds the extra splits of all rows together) each
find their row and split from the prefix sum of the rows' extra splits; pool blocks left over write nothing. A row
of one split writes O directly; the others merge in their last CTA (arrival counter), or, on a plan whose merge is
not ``last_cta``, rows of more than LAST_CTA_MAX_ROWS partial rows in a combine kernel launched by the same host call
that derives the same plan from L: one CTA a (query head, such row), at most combine_rows of them, each finding its
row by a prefix scan of the rows' flags. The launch depends on shapes only: a CUDA graph captured once stays correct when
the lengths change between replays.

Batch, cache length / number of pages, block_table width and num_splits are dynamic (symbolic) dims, so one
compiled kernel serves every shape of a (dtype, heads, head_dim, layout, tile config).
"""
import dataclasses
import math
import threading

import torch

LOG2E = 1.4426950408889634

_KERNELS: dict = {}
_LOCK = threading.Lock()

_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}

#: the head dims the kernels are built for (a Q/K/V tile row is d elements; block_H x d and the combine's d threads)
HEAD_DIMS = (64, 128)

#: rows a thread's softmax reductions take at once (build_decode's red_batch), where red_batch_default picks 2: a
#: thread of a 16-row tile holds two rows, so 2 reduces both through one butterfly (its barriers shared), half the
#: barriers of one row at a time. TileLang's reduce ``batch``; a backend without it (an older fork) runs red_batch 1.
RED_BATCH = 2

#: ``red_once`` (build_decode): C++ prepended to the kernel source (TileLang emits a kernel's prelude before its own
#: includes, so it includes the template it specializes), a partial specialization of TileLang's
#: ``tl::AllReduce`` for a reduction that crosses four warps (participants t ^ 32, t ^ 64, t ^ 96). TileLang's
#: butterfly crosses them in two shared-memory rounds of two barriers each; this writes once, waits once and
#: combines the four values (in warp order, the same order on every participant, so every copy of a row's max
#: and sum has the same bits). An eight-warp reduction's first round (t ^ 128) stays TileLang's, then this.
#: CUDA only: it names TileLang's CUDA template (a backend with other templates builds with red_once off).
RED_ONCE_PRELUDE = r"""
#include <tl_templates/cuda/reduce.h>
namespace tl {
template <class Reducer, int thread_offset, class Barrier, int batch_size, int workspace_stride>
struct AllReduce<Reducer, 128, 32, thread_offset, Barrier, batch_size, workspace_stride> {
  template <typename T> static TL_DEVICE T run(T x, T *red_buf = nullptr) {
    const int t = threadIdx.x - thread_offset, b = t & ~96;
    Barrier::template sync<1>();
    red_buf[t] = x;
    Barrier::template sync<2>();
    return Reducer()(Reducer()(red_buf[b], red_buf[b + 32]), Reducer()(red_buf[b + 64], red_buf[b + 96]));
  }
  template <typename T> static TL_DEVICE void run_batch(T *x, T *red_buf = nullptr) {
    const int t = threadIdx.x - thread_offset, b = t & ~96;
    Barrier::template sync<1>();
#pragma unroll
    for (int i = 0; i < batch_size; i++) red_buf[t + i * workspace_stride] = x[i];
    Barrier::template sync<2>();
#pragma unroll
    for (int i = 0; i < batch_size; i++) {
      const T *r = red_buf + i * workspace_stride;
      x[i] = Reducer()(Reducer()(r[b], r[b + 32]), Reducer()(r[b + 64], r[b + 96]));
    }
  }
};
}  // namespace tl
"""


# ----------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------
# the plan
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Plan:
    """What one call runs: the build parameters of its kernel and the host's launch facts, resolved once per shape
    (run_kernel._cuda_plan) and read by the builders. Checked on construction (check_plan)."""

    dtype: str
    hq: int
    hkv: int
    d: int
    paged: bool
    #: tokens a page (0: a contiguous cache)
    page_size: int
    block_N: int
    threads: int
    #: splits of a row (balanced: at most this many); 1: the direct kernel. The kernels take it at run time.
    num_splits: int
    scale: float
    #: the balanced kernel's target CTAs (about BAL_CTAS_PER_SM a unit); 0: uniform splits
    balanced: int = 0
    #: split partials merged by the last CTA of each row; else a combine kernel merges them (balanced: the rows of
    #: more than LAST_CTA_MAX_ROWS partial rows; the others still merge in their last CTA)
    last_cta: bool = False
    eager: bool = False
    v_split: int = 1
    red_batch: int = 1
    red_once: bool = False
    tile_page: bool = False
    even_split: bool = False
    #: an eager paged plan's first K tile takes each row's offset in its page from L[b] (k_clamp_default)
    k_clamp: bool = False
    pdl: bool = False
    #: splits a combine thread loads at once (0: _COMBINE_UNROLL)
    comb_unroll: int = 0
    #: nvcc's --use_fast_math (a compile flag: the lowered source is the same)
    fast_math: bool = False

    def __post_init__(self):
        check_plan(self)

    @property
    def G(self) -> int:
        """Query heads per KV head."""
        return self.hq // self.hkv

    @property
    def split(self) -> bool:
        """Whether rows are split (partials and a merge): a uniform split count over 1, or the balanced kernel."""
        return self.num_splits > 1 or bool(self.balanced)

    @property
    def combine(self) -> bool:
        """Whether a combine kernel merges split partials (the plans pdl applies to)."""
        return self.split and not self.last_cta

    @property
    def counter(self) -> bool:
        """Whether the kernel merges in a row's last CTA (an arrival counter a (batch, kv head)): the balanced kernel
        always (rows of at most LAST_CTA_MAX_ROWS partial rows), a uniform split one with last_cta."""
        return bool(self.balanced) or (self.split and self.last_cta)

    @property
    def kernel(self) -> str:
        """The main kernel's name."""
        if self.balanced:
            return "decode_balanced"
        if not self.split:
            return "decode_direct"
        return "decode_split_last" if self.last_cta else "decode_split_combine"

    @property
    def plan_class(self) -> str:
        """direct (one CTA a row, or v_split), split (uniform splits) or balanced: what a tuned row must share with a
        shape to apply to it."""
        return "balanced" if self.balanced else "split" if self.split else "direct"

    def build_key(self) -> "Plan":
        """What the compiled kernel depends on: the plan with its split count cut to 2 (the count is a run-time dim;
        whether there is more than one is not), or, where the row's last CTA merges a uniform split count, to the
        splits its merge loads in one round (merge_unroll)."""
        if self.last_cta and not self.balanced:
            return dataclasses.replace(self, num_splits=merge_unroll(self.G, self.d, self.threads, self.num_splits))
        return dataclasses.replace(self, num_splits=min(self.num_splits, 2))


def check_plan(p: Plan) -> None:
    """The rules a plan obeys, each a ValueError naming the field: the kernels are built for them. The balanced
    kernel splits (num_splits >= 2 rows at most), merges in its rows' last CTAs (and in a combine kernel where
    last_cta is off) and is not eager."""
    if p.d not in HEAD_DIMS:
        raise ValueError(f"head_dim {p.d} is not supported: the CUDA kernels take head dims "
                         f"{', '.join(map(str, HEAD_DIMS))}")
    if p.hkv < 1 or p.hq % p.hkv:
        raise ValueError(f"hq ({p.hq}) must be a multiple of hkv ({p.hkv})")
    if p.num_splits < 1 or (p.balanced and p.num_splits < 2):
        raise ValueError(f"num_splits={p.num_splits}: at least 1, and 2 on a balanced plan")
    if p.balanced and p.eager:
        raise ValueError("eager=1 on a balanced plan: the balanced kernel reads a row's length before its first "
                         "tile (balanced=0, or pin num_splits, for an eager plan)")
    if p.last_cta and not p.split:
        raise ValueError("last_cta on an unsplit plan: it has no partials to merge")
    if p.last_cta and not p.balanced and p.num_splits > _MAX_SPLITS:
        raise ValueError(f"last_cta=1 with num_splits={p.num_splits}: the last-CTA merge holds at most {_MAX_SPLITS}")
    if p.v_split not in (1, 2) or (p.v_split > 1 and p.split):
        raise ValueError(f"v_split must be 1, or 2 on the direct-output kernel (no split), got {p.v_split} with "
                         f"num_splits={p.num_splits}{' (balanced)' if p.balanced else ''}")
    if p.red_batch not in (1, 2):
        raise ValueError(f"red_batch must be 1 or 2, got {p.red_batch}")
    if p.tile_page and not tile_page_applies(p.paged, p.page_size, p.block_N, p.eager):
        raise ValueError(f"tile_page on a plan it cannot run on (paged {p.paged}, page {p.page_size}, block_N "
                         f"{p.block_N}, eager {p.eager})")
    if p.k_clamp and not (p.eager and p.paged):
        raise ValueError(f"k_clamp on a plan it cannot run on (eager {p.eager}, paged {p.paged}): it clamps an eager "
                         "paged first K tile's rows")
    if p.even_split and p.eager:
        raise ValueError("even_split=1 on an eager plan: eager split ranges come from the allocated length (eager=0)")
    if p.pdl and not p.combine:
        raise ValueError("pdl on a plan without a combine kernel")


def kernel_plan(dtype="float16", hq=32, hkv=8, d=128, paged=False, page_size=256, block_N=64, threads=128,
                split=True, scale=None, eager=False, last_cta=None, balanced=0, pdl=False, comb_unroll=0, v_split=1,
                red_batch=RED_BATCH, red_once=False, tile_page=False, even_split=False, k_clamp=False) -> Plan:
    """A Plan from build parameters alone, for GPU-less checks (run_kernel._cuda_plan resolves the real ones):
    ``split`` stands for two splits (the kernels take the count at run time); ``last_cta`` None: the balanced
    kernel's merge in its last CTAs, a uniform split kernel's in its combine kernel."""
    split = bool(split) or bool(balanced)
    merge_last = bool(balanced) if last_cta is None else bool(last_cta)
    return Plan(dtype=dtype, hq=hq, hkv=hkv, d=d, paged=bool(paged), page_size=int(page_size) if paged else 0,
                block_N=block_N, threads=threads, num_splits=2 if split else 1,
                scale=float(scale) if scale is not None else 1.0 / math.sqrt(d), balanced=int(balanced),
                last_cta=merge_last and split, eager=bool(eager), v_split=int(v_split), red_batch=int(red_batch),
                red_once=bool(red_once), tile_page=bool(tile_page), even_split=bool(even_split), pdl=bool(pdl),
                comb_unroll=int(comb_unroll), k_clamp=bool(k_clamp))


# ----------------------------------------------------------------------------------------------
# kernel builders: one CTA's tiles (_decode_body), an epilogue per kernel, a prim_func per kernel
# ----------------------------------------------------------------------------------------------
def _block_h(G: int) -> int:
    return max(16, ((G + 15) // 16) * 16)


def _symbols(T, p: Plan) -> dict:
    """The prim_funcs' dynamic dims and the cache's shape: batch, max_pages, num_splits, kv_shape, alloc_len (the
    longest sequence the cache holds), num_blocks (paged) or seqlen_k."""
    batch = T.dynamic("batch")
    max_pages = T.dynamic("max_pages")
    num_splits = T.dynamic("num_splits")
    sym = dict(batch=batch, max_pages=max_pages, num_splits=num_splits, num_blocks=None)
    if p.paged:
        num_blocks = T.dynamic("num_blocks")
        sym.update(num_blocks=num_blocks, kv_shape=[num_blocks, p.page_size, p.hkv, p.d],
                   alloc_len=max_pages * p.page_size)  # the longest sequence the block table can describe
    else:
        seqlen_k = T.dynamic("seqlen_k")
        sym.update(kv_shape=[batch, seqlen_k, p.hkv, p.d], alloc_len=seqlen_k)
    return sym


def _decode_body(T, p: Plan, sym: dict, finish):
    """The macro a decode CTA runs: the tiles [t_begin, t_end) of its split of row b's keys for the G query heads of
    kv head h (Q, K and V through shared memory, QK^T and PV on the tensor cores, the online exp2 softmax in fp32),
    then ``finish(acc_o, l_sum, m_cur, Out, Opart, LSE, Cnt, h, b, sid, nsplit, active, vc)``, the kernel's epilogue.

    ``eager``: Q rides in each tile's cp.async group with K (a copy outside the loop would be a synchronous load and a
    barrier before the first K/V loads). ``tile_page``: a row's table column is the tile's first page plus the row's
    page within the tile (tile_pid), not its clamped key // page_size, so the rows a thread copies from one page share
    one table load and one page address (lowered R1 plan, 256-token pages: 57 -> 27 global loads, 2381 -> 2092 PTX
    instructions). ``even_split``: split s of a row of n tiles in ns splits takes tiles [s n // ns, (s + 1) n // ns),
    so the splits differ by at most one tile and none is empty while n >= ns; without it each takes ceil(n / ns)
    tiles and the last ones may be short or empty (R4 in 16-token pages: 481 tiles in 60 splits, 54 of 9 tiles and
    6 empty). ``red_batch``: the softmax's row max and row sum each reduce a thread's rows red_batch at a time (one
    shared-memory butterfly, one set of barriers, for both of a thread's rows of a 16-row tile).

    A split's range of tiles is held in local variables (T.alloc_var), as are the balanced kernel's row, split and
    split count: a Python name bound to an expression is inlined at every use, so every tile op's indices carried the
    whole expression (the split's first tile, a division by the run-time split count; the balanced plan's prefix
    sums), TileLang's layout inference and simplifier re-analysed it in each, and nvcc recomputed the division for
    every tile (a quick verdict's 34 kernels lowered in 174 s, now 102 s, on a CPU host; the balanced tile loop 573
    PTX instructions, now 352)."""
    G, d, dtype, block_N, paged, page_size = p.G, p.d, p.dtype, p.block_N, p.paged, p.page_size
    block_H = _block_h(G)
    accum = "float32"
    sm_scale = float(p.scale) * LOG2E
    alloc_len, num_blocks = sym["alloc_len"], sym["num_blocks"]
    eager, even_split, red_batch, k_clamp = p.eager, p.even_split, p.red_batch, p.k_clamp
    q_loop = eager
    tile_page = p.tile_page
    num_stages = 1  # TileLang pipelines a dynamic trip count with one stage (iteration 4: two needed a fixed count)
    dv = d // p.v_split
    policy = T.GemmWarpPolicy.FullCol

    def kv_row(BT, b, pos, clamp_page=False):
        if paged and clamp_page:  # a table entry past the sequence may be anything: clamp it into the pool
            return T.max(T.min(BT[b, pos // page_size], num_blocks - 1), 0), pos % page_size
        if paged:  # pos < L[b]: the entry is a page of this sequence
            return BT[b, pos // page_size], pos % page_size
        return b, pos

    def tile_pid(base, i, seqlen):
        """The table column of row i of the tile at key `base`, clamped to the sequence's last page: base //
        page_size + i // page_size (base is a multiple of the page or of the tile, whichever is smaller), so a thread's
        rows of one page share one load and one page address once lowered (i // page_size folds to a constant per
        unrolled row)."""
        return T.min(base // page_size + i // page_size, (seqlen - 1) // page_size)

    @T.macro
    def body(Q, K, V, L, BT, sid, h, b, nsplit, Out, Opart, LSE, Cnt=None, active=None, vc=0):
        Q_shared = T.alloc_shared([block_H, d], dtype)
        K_shared = T.alloc_shared([block_N, d], dtype)
        V_shared = T.alloc_shared([block_N, dv], dtype)
        P_shared = T.alloc_shared([block_H, block_N], dtype)
        acc_s = T.alloc_fragment([block_H, block_N], accum)
        acc_o = T.alloc_fragment([block_H, dv], accum)
        m_prev = T.alloc_fragment([block_H], accum)
        m_cur = T.alloc_fragment([block_H], accum)
        m_use = T.alloc_fragment([block_H], accum)
        m_ref = m_use if eager else m_cur
        r_scale = T.alloc_fragment([block_H], accum)
        r_sum = T.alloc_fragment([block_H], accum)
        l_sum = T.alloc_fragment([block_H], accum)

        seqlen = L[b]
        n_tiles = T.ceildiv(seqlen, block_N)
        if eager:  # the split ranges from the cache's allocated length: the first loads need no L[b]
            per_split = T.ceildiv(T.ceildiv(alloc_len, block_N), nsplit)
            t_begin = sid * per_split
            t_end = T.min(t_begin + per_split, n_tiles)
        elif even_split:  # splits differ by at most one tile (an idle pool block's sid = nsplit: empty)
            t_begin = T.min(sid * n_tiles // nsplit, n_tiles)
            t_end = T.min((sid + 1) * n_tiles // nsplit, n_tiles)
        else:
            per_split = T.ceildiv(n_tiles, nsplit)
            t_begin = sid * per_split
            t_end = T.min(t_begin + per_split, n_tiles)
        tb = T.alloc_var("int32")  # the split's range held in registers (the docstring's last paragraph)
        te = T.alloc_var("int32")
        tb = t_begin
        te = t_end
        n_iter = T.max(te - tb, 0)

        if not q_loop:
            for i, j in T.Parallel(block_H, d):
                Q_shared[i, j] = T.if_then_else(i < G, Q[b, h * G + T.min(i, G - 1), j], T.cast(0, dtype))
        T.fill(acc_o, 0)
        T.fill(l_sum, 0)
        T.fill(m_cur, -T.infinity(accum))
        tp = tile_page and not eager  # eager rows may pass the sequence: they keep the per-row clamped page

        for k in T.Pipelined(T.max(n_iter, 1) if eager else n_iter, num_stages=num_stages):
            base = (tb + k) * block_N
            if q_loop:  # Q rides in the first cp.async group with K (a copy outside the loop would be a
                # synchronous load and a barrier before the first K/V loads); later iterations
                # re-read its 4 KB from L2. Padded rows repeat head G-1: their outputs are never written.
                for i, j in T.Parallel(block_H, d):
                    Q_shared[i, j] = Q[b, h * G + T.min(i, G - 1), j]
            if tp:  # rows of one page share its table load (tile_pid)
                for i, j in T.Parallel(block_N, d):
                    K_shared[i, j] = K[BT[b, tile_pid(base, i, seqlen)], T.min(base + i, seqlen - 1) % page_size, h, j]
            else:
                for i, j in T.Parallel(block_N, d):
                    # eager: the first K tile's rows are clamped to the allocated cache (valid memory, paged or
                    # not: page ids are clamped into the pool; keys past the sequence are masked below), so it
                    # does not wait for L[b]; from the second tile on L[b] has arrived (the range's end is
                    # read from it), and rows past the sequence re-read its last key, as a non-eager plan's
                    # do, instead of streaming the rest of the allocated tile (only eager K rows can pass the
                    # sequence: only they pay the page-id clamp)
                    lim = T.if_then_else(k == 0, alloc_len, seqlen) if eager else seqlen
                    r0, r1 = kv_row(BT, b, T.min(base + i, lim - 1), clamp_page=eager)
                    if k_clamp:  # the row within its page from L[b], which arrives with the table read: a row
                        # past the sequence re-reads the sequence's last offset in the same table page (one row a
                        # page past the sequence, masked), not the rest of the allocated tile. No max(.., 0) for
                        # an empty sequence: the offset -1 wraps to the page's last row (floormod), valid memory;
                        # the guard cost the direct kernel 60 registers (ptxas, sm_90a: 126 -> 186)
                        r1 = T.min(base + i, seqlen - 1) % page_size
                    K_shared[i, j] = K[r0, r1, h, j]
            T.clear(acc_s)
            T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=policy)
            for i, j in T.Parallel(block_H, block_N):
                acc_s[i, j] = T.if_then_else(base + j < seqlen, acc_s[i, j] * sm_scale, -T.infinity(accum))
            T.copy(m_cur, m_prev)
            T.reduce_max(acc_s, m_cur, dim=1, clear=False, batch=red_batch)
            if eager:  # a tile wholly past the sequence leaves m at -inf: scale by 0, not by NaN
                for i in T.Parallel(block_H):
                    m_use[i] = T.if_then_else(m_cur[i] == -T.infinity(accum), 0.0, m_cur[i])
            for i in T.Parallel(block_H):
                r_scale[i] = T.exp2(m_prev[i] - m_ref[i])
            for i, j in T.Parallel(block_H, block_N):
                acc_s[i, j] = T.exp2(acc_s[i, j] - m_ref[i])
            T.reduce_sum(acc_s, r_sum, dim=1, batch=red_batch)
            for i in T.Parallel(block_H):
                l_sum[i] = l_sum[i] * r_scale[i] + r_sum[i]
            T.copy(acc_s, P_shared)
            for i, j in T.Parallel(block_H, dv):
                acc_o[i, j] *= r_scale[i]
            if tp:
                for i, j in T.Parallel(block_N, dv):
                    V_shared[i, j] = V[BT[b, tile_pid(base, i, seqlen)], T.min(base + i, seqlen - 1) % page_size, h,
                                       vc * dv + j]
            else:
                for i, j in T.Parallel(block_N, dv):
                    # eager runs one tile even for an empty sequence (L[b] = 0): that V row's page is clamped too
                    r0, r1 = kv_row(BT, b, T.max(T.min(base + i, seqlen - 1), 0), clamp_page=eager)
                    V_shared[i, j] = V[r0, r1, h, vc * dv + j]
            T.gemm(P_shared, V_shared, acc_o, policy=policy)
        finish(acc_o, l_sum, m_cur, Out, Opart, LSE, Cnt, h, b, sid, nsplit, active, vc)

    return body


def _write_partial(T, p: Plan):
    """Epilogue piece: a split's normalised partial O and its log2-sum-exp to the workspaces."""
    G, d, block_H, accum = p.G, p.d, _block_h(p.G), "float32"

    @T.macro
    def write_partial(acc_o, l_sum, m_cur, Opart, LSE, h, b, sid):
        for i, j in T.Parallel(block_H, d):
            if i < G:
                Opart[b, h * G + i, sid, j] = T.if_then_else(l_sum[i] > 0, acc_o[i, j] / l_sum[i], 0.0)
        for i in T.Parallel(block_H):
            if i < G:
                LSE[b, h * G + i, sid] = T.if_then_else(l_sum[i] > 0, T.log2(l_sum[i]) + m_cur[i], -T.infinity(accum))

    return write_partial


def _finish_direct(T, p: Plan):
    """decode_direct's epilogue: O (its vc-th of v_split column blocks) written directly."""
    G, dtype, block_H, dv = p.G, p.dtype, _block_h(p.G), p.d // p.v_split

    @T.macro
    def finish(acc_o, l_sum, m_cur, Out, Opart, LSE, Cnt, h, b, sid, nsplit, active, vc):
        for i, j in T.Parallel(block_H, dv):
            if i < G:
                Out[b, h * G + i, vc * dv + j] = T.cast(T.if_then_else(l_sum[i] > 0, acc_o[i, j] / l_sum[i], 0.0),
                                                        dtype)

    return finish


def _finish_split(T, p: Plan):
    """The uniform split kernels' epilogue: the partials, then (last_cta) the row's merge by its last CTA."""
    write_partial = _write_partial(T, p)
    merge_last = (_last_cta_macro(T, "float32", p.dtype, p.G, p.d, merge_unroll(p.G, p.d, p.threads, p.num_splits),
                                  p.threads) if p.last_cta else None)
    last_cta = p.last_cta

    @T.macro
    def finish(acc_o, l_sum, m_cur, Out, Opart, LSE, Cnt, h, b, sid, nsplit, active, vc):
        write_partial(acc_o, l_sum, m_cur, Opart, LSE, h, b, sid)
        if last_cta:
            merge_last(Opart, LSE, Cnt, Out, h, b, nsplit)

    return finish


def _finish_balanced(T, p: Plan):
    """decode_balanced's epilogue: a row of one split writes O itself; the others write their partials and merge in
    the row's last CTA, except (a combine kernel follows) rows of more than LAST_CTA_MAX_ROWS partial rows; idle pool
    CTAs write nothing."""
    G, d, dtype, block_H = p.G, p.d, p.dtype, _block_h(p.G)
    write_partial = _write_partial(T, p)
    merge_last = _last_cta_macro(T, "float32", dtype, G, d, _LAST_UNROLL, p.threads)
    bal_combine = p.combine

    @T.macro
    def finish(acc_o, l_sum, m_cur, Out, Opart, LSE, Cnt, h, b, sid, nsplit, active, vc):
        if active:
            if nsplit == 1:
                for i, j in T.Parallel(block_H, d):
                    if i < G:
                        Out[b, h * G + i, j] = T.cast(T.if_then_else(l_sum[i] > 0, acc_o[i, j] / l_sum[i], 0.0), dtype)
            else:
                write_partial(acc_o, l_sum, m_cur, Opart, LSE, h, b, sid)
                if bal_combine:
                    if nsplit * G <= LAST_CTA_MAX_ROWS:
                        merge_last(Opart, LSE, Cnt, Out, h, b, nsplit)
                else:
                    merge_last(Opart, LSE, Cnt, Out, h, b, nsplit)

    return finish


def _build_direct(T, p: Plan, sym: dict, pre):
    batch, kv_shape, max_pages = sym["batch"], sym["kv_shape"], sym["max_pages"]
    hq, hkv, d, dtype, threads, v_split = p.hq, p.hkv, p.d, p.dtype, p.threads, p.v_split
    body = _decode_body(T, p, sym, _finish_direct(T, p))

    @T.prim_func
    def decode_direct(
        Q: T.Tensor([batch, hq, d], dtype),
        K: T.Tensor(kv_shape, dtype),
        V: T.Tensor(kv_shape, dtype),
        L: T.Tensor([batch], "int32"),
        BT: T.Tensor([batch, max_pages], "int32"),
        Out: T.Tensor([batch, hq, d], dtype),
    ):
        with T.Kernel(v_split, hkv, batch, threads=threads, prelude=pre) as (vc, h, b):
            body(Q, K, V, L, BT, 0, h, b, 1, Out, None, None, vc=vc)

    return decode_direct


def _build_split_last(T, p: Plan, sym: dict, pre):
    batch, kv_shape, max_pages, num_splits = sym["batch"], sym["kv_shape"], sym["max_pages"], sym["num_splits"]
    hq, hkv, d, dtype, threads, accum = p.hq, p.hkv, p.d, p.dtype, p.threads, "float32"
    body = _decode_body(T, p, sym, _finish_split(T, p))

    @T.prim_func
    def decode_split_last(
        Q: T.Tensor([batch, hq, d], dtype),
        K: T.Tensor(kv_shape, dtype),
        V: T.Tensor(kv_shape, dtype),
        L: T.Tensor([batch], "int32"),
        BT: T.Tensor([batch, max_pages], "int32"),
        Opart: T.Tensor([batch, hq, num_splits, d], accum),
        LSE: T.Tensor([batch, hq, num_splits], accum),
        Cnt: T.Tensor([batch, hkv], "int32"),
        Out: T.Tensor([batch, hq, d], dtype),
    ):
        with T.Kernel(num_splits, hkv, batch, threads=threads, prelude=pre) as (sid, h, b):
            body(Q, K, V, L, BT, sid, h, b, num_splits, Out, Opart, LSE, Cnt)

    return decode_split_last


def _build_split_combine(T, p: Plan, sym: dict, pre):
    """The split kernel and the combine kernel behind it in one prim_func: one host call launches both, so no Python
    runs between the two launches. ``pdl`` (Hopper and later): programmatic dependent launch of the combine kernel:
    the split kernel's CTAs allow it at their start, so the combine kernel is launched and its CTAs made resident
    while the split kernel still runs; each waits for the split grid's completion and memory (griddepcontrol.wait)
    before it reads a partial. It saves the launch gap between the two kernels, not a byte of traffic."""
    batch, kv_shape, max_pages, num_splits = sym["batch"], sym["kv_shape"], sym["max_pages"], sym["num_splits"]
    hq, hkv, d, dtype, threads, accum, pdl = p.hq, p.hkv, p.d, p.dtype, p.threads, "float32", p.pdl
    body = _decode_body(T, p, sym, _finish_split(T, p))
    combine_body = _combine_macro(T, accum, dtype, p.comb_unroll, lse_smem=True, nthreads=d)

    @T.prim_func
    def decode_split_combine(
        Q: T.Tensor([batch, hq, d], dtype),
        K: T.Tensor(kv_shape, dtype),
        V: T.Tensor(kv_shape, dtype),
        L: T.Tensor([batch], "int32"),
        BT: T.Tensor([batch, max_pages], "int32"),
        Opart: T.Tensor([batch, hq, num_splits, d], accum),
        LSE: T.Tensor([batch, hq, num_splits], accum),
        Out: T.Tensor([batch, hq, d], dtype),
    ):
        with T.Kernel(num_splits, hkv, batch, threads=threads, prelude=pre) as (sid, h, b):
            if pdl:
                T.pdl_trigger()
            body(Q, K, V, L, BT, sid, h, b, num_splits, None, Opart, LSE)
        with T.Kernel(hq, batch, threads=d) as (hh, b2):
            if pdl:
                T.pdl_sync()
            combine_body(Opart, LSE, Out, hh, b2, num_splits, T.get_thread_binding())

    return decode_split_combine


def _build_balanced(T, p: Plan, sym: dict, pre):
    """decode_balanced (the module docstring): every block derives the plan from L alone (no host sync, no second
    kernel), so the same launch serves any lengths; with a combine kernel (last_cta off) one CTA per (query head, row
    too large for one CTA's merge) merges it: combine_rows CTAs a query head, not the batch's."""
    batch, kv_shape, max_pages, num_splits = sym["batch"], sym["kv_shape"], sym["max_pages"], sym["num_splits"]
    hq, hkv, d, dtype, threads, accum, pdl, G = p.hq, p.hkv, p.d, p.dtype, p.threads, "float32", p.pdl, p.G
    block_N, bal_combine = p.block_N, p.combine
    body = _decode_body(T, p, sym, _finish_balanced(T, p))
    combine_body = _combine_macro(T, accum, dtype, p.comb_unroll, lse_smem=True, nthreads=d)
    target = p.balanced
    pool = -(-target // hkv)  # per kv head: the extra splits of all rows together never exceed this
    crows = combine_rows(target, hkv, G)
    min_tiles = BAL_MIN_TILES

    def row_splits(length, w):
        """A row's splits: its tiles / w rounded to nearest, 1..num_splits."""
        return T.min(T.max((T.ceildiv(length, block_N) * 2 + w) // (w * 2), 1), num_splits)

    def batch_tiles(n):
        """The macro that sums the batch's tiles into tot[0] on a CTA of n threads: each thread sums every n-th
        length, then one reduction, so the lengths are read in ceil(batch / n) round trips, not batch / 4 (nvcc's
        unrolled serial loop)."""

        @T.macro
        def tiles(L, part, tot):
            T.clear(part)
            for j in T.serial(T.ceildiv(batch, n)):
                for t in T.Parallel(n):
                    part[t] += T.if_then_else(j * n + t < batch, T.ceildiv(L[T.min(j * n + t, batch - 1)], block_N), 0)
            T.reduce_sum(part, tot, dim=0)

        return tiles

    split_tiles, combine_tiles = batch_tiles(threads), batch_tiles(d)

    def slot_finder(n, weight):
        """The macro that finds, on a CTA of n threads, the row whose slots hold slot k, where row r holds
        weight(L[r], w) consecutive slots after the rows before it: a thread a row, the weights' inclusive prefix sum
        in shared memory (T.cumsum, a warp's shuffles), and the thread whose range holds k writes its row to f_s[0] and
        k's offset in that range to f_s[1] (both stay -1 when no row holds k); ceil(batch / n) rounds, not a serial
        walk of batch steps. The pool blocks find their row and split with it, the combine CTAs their row."""

        @T.macro
        def find(L, w, k, e_s, f_s):
            acc = T.alloc_var("int32")  # the rows' slots before this round
            for i in T.Parallel(2):
                f_s[i] = -1
            acc = 0
            for j in T.serial(T.ceildiv(batch, n)):
                for t in T.Parallel(n):
                    e_s[t] = T.if_then_else(j * n + t < batch, weight(L[T.min(j * n + t, batch - 1)], w), 0)
                T.cumsum(e_s, dim=0)
                for t in T.Parallel(n):
                    lo = acc + T.if_then_else(t > 0, e_s[T.max(t - 1, 0)], 0)
                    if lo <= k and k < acc + e_s[t]:
                        f_s[0] = j * n + t
                        f_s[1] = k - lo
                acc += e_s[n - 1]

        return find

    # a row's pool slots are its extra splits; its combine slot, one where its partial rows exceed the last CTA's merge
    find_pool_slot = slot_finder(threads, lambda length, w: row_splits(length, w) - 1)
    find_combine_row = slot_finder(
        d, lambda length, w: T.if_then_else(row_splits(length, w) * G > LAST_CTA_MAX_ROWS, 1, 0))

    @T.prim_func
    def decode_balanced(
        Q: T.Tensor([batch, hq, d], dtype),
        K: T.Tensor(kv_shape, dtype),
        V: T.Tensor(kv_shape, dtype),
        L: T.Tensor([batch], "int32"),
        BT: T.Tensor([batch, max_pages], "int32"),
        Opart: T.Tensor([batch, hq, num_splits, d], accum),
        LSE: T.Tensor([batch, hq, num_splits], accum),
        Cnt: T.Tensor([batch, hkv], "int32"),
        Out: T.Tensor([batch, hq, d], dtype),
    ):
        # blocks y < batch: the first split of row y; y >= batch: pool block j = y - batch, the
        # (j - P(b) + 1)-th split of the row b with P(b) <= j < P(b + 1), P the prefix sum of the
        # rows' extra splits. Every block derives the plan from L alone (no host sync, no second
        # kernel), so the same launch serves any lengths.
        with T.Kernel(hkv, batch + pool, threads=threads, prelude=pre) as (h, y):
            if pdl and bal_combine:
                T.pdl_trigger()
            tot = T.alloc_var("int32")
            rb = T.alloc_var("int32")
            rs = T.alloc_var("int32")
            part = T.alloc_fragment([threads], "int32")
            e_s = T.alloc_shared([threads], "int32")
            f_s = T.alloc_shared([2], "int32")
            tot_f = T.alloc_fragment([1], "int32")
            split_tiles(L, part, tot_f)
            tot = tot_f[0]
            # tiles per split: the batch's tiles over the target CTAs, at least min_tiles
            w = T.max(T.ceildiv(tot * hkv, target), min_tiles)
            rb = y
            rs = 0
            if y >= batch:
                # pool block j = y - batch: row b's extra splits take the pool slots [P(b), P(b + 1)) (slot_finder);
                # slot j - P(b) of them is its split j - P(b) + 1
                find_pool_slot(L, w, y - batch, e_s, f_s)
                rb = f_s[0]
                rs = f_s[1] + 1
            bb = T.alloc_var("int32")
            ns = T.alloc_var("int32")
            sd = T.alloc_var("int32")  # registers, not expressions inlined into the body (_decode_body)
            bb = T.max(rb, 0)
            ns = row_splits(L[bb], w)
            # an idle pool block (rb < 0) gets sid = ns: an empty range, and it writes nothing
            sd = T.if_then_else(rb >= 0, rs, ns)
            body(Q, K, V, L, BT, sd, h, bb, ns, Out, Opart, LSE, Cnt, rb >= 0)
        if bal_combine:  # rows too large for one CTA's merge: one CTA per (query head, such row)
            with T.Kernel(hq, T.min(batch, crows), threads=d) as (hh, c):
                part2 = T.alloc_fragment([d], "int32")  # the batch's tiles as the split grid sums them
                tot2 = T.alloc_fragment([1], "int32")
                c_s = T.alloc_shared([d], "int32")
                r_s = T.alloc_shared([2], "int32")
                combine_tiles(L, part2, tot2)
                w2 = T.max(T.ceildiv(tot2[0] * hkv, target), min_tiles)
                # CTA c merges the c-th row that needs the combine kernel (combine_rows bounds them; slot_finder)
                find_combine_row(L, w2, c, c_s, r_s)
                b2 = T.alloc_var("int32")
                b2 = r_s[0]
                ns2 = row_splits(L[T.max(b2, 0)], w2)
                if pdl:  # the plan comes from L alone: made before the wait for the split grid
                    T.pdl_sync()
                if b2 >= 0:
                    combine_body(Opart, LSE, Out, hh, b2, ns2, T.get_thread_binding())

    return decode_balanced


_BUILDERS = {"decode_direct": _build_direct, "decode_split_last": _build_split_last,
             "decode_split_combine": _build_split_combine, "decode_balanced": _build_balanced}


def build_decode(p: Plan):
    """TileLang prim_func of a plan's kernel (Plan.kernel; a combine kernel in the same prim_func where one follows).
    ``red_once`` (CUDA): a reduction across four warps crosses them in one shared-memory round (RED_ONCE_PRELUDE,
    on the prim_func's first kernel only: one definition a module)."""
    import tilelang.language as T

    pre = RED_ONCE_PRELUDE if p.red_once else None
    return _BUILDERS[p.kernel](T, p, _symbols(T, p), pre)


#: splits a combine thread loads before it merges any (its LSE and partial-O values in flight at once): 32
#: loads a split plan's 32 splits in one round trip (H200, iteration 14: case 10 9.02 -> 8.83 us and case 14
#: 35.07 -> 34.72 us against 16, case 13's 33 splits unchanged)
_COMBINE_UNROLL = 32
#: balanced variant: at least this many KV tiles per split
BAL_MIN_TILES = 4
#: balanced variant: target CTAs per unit (the batch's real tiles are spread over about this many waves' CTAs)
BAL_CTAS_PER_SM = 2
#: balanced variant: from this many query heads per KV head, 128-key tiles at one CTA per unit, contiguous caches
#: only (H200, iteration 12: R4 (G 8) 37.8 -> 36.9 us, R3 (G 8) -0.9%; with G 4 R1 and case 12 were 2.2% and 0.8%
#: slower; in 16-token pages R3 140.3 -> 149.4 us and R4 42.4 -> 43.6 us, in 256-token pages R3 +1%)
BAL_WIDE_GQA = 8
#: balanced variant: in pages of at most this many tokens, 128-key tiles (at BAL_CTAS_PER_SM): with tile_page a tile's
#: rows share their pages' table loads and addresses, so a longer tile spreads a tile's fixed work over more keys (H200,
#: iteration 34's screen, 16-token pages: R1 1.027, R3 1.013, R4 0.994; 256-token pages R3 0.988, R4 0.958)
BAL_WIDE_MAX_PAGE = 16
#: balanced variant by default only from this many 64-key tiles of allocated length: below it one full-length
#: row in a batch of empty ones costs little, and the plain kernel skips the planning prologue
BAL_MIN_ALLOC_TILES = 256
#: balanced variant in a paged cache by default from this many 64-key tiles of allocated length, where the uniform plan
#: splits a row at most BAL_MAX_UNIFORM_SPLITS ways (many rows: a long one is a long chain there). H100, iteration 53,
#: draws of seeds 101-106 and 201-208: 1.01-2.17x on 16 ragged paged draws, 0.949-0.983x on 4 paged batches of equal
#: or uniform rows; with 16 rows, which the uniform plan splits 15-16 ways, the balanced kernel lost 4-10%
BAL_MIN_PAGED_TILES = 16
BAL_MAX_UNIFORM_SPLITS = 4
#: balanced variant in a paged cache also where the rows fill the units, from this many 64-key tiles of allocated
#: length, up to BAL_WAVE_ROWS_PER_UNIT rows a unit (about two waves of the direct kernel's CTAs at head dim 128): the
#: direct kernel's time is then its longest row's chain, and a row at the cache's length outlasts the batch's average
#: work a slot unless the rows are near equal. H100, iteration 57: ragged draws (lognormal, few-long) 1.09-1.97x,
#: batches of equal rows 0.967-0.999x (a row there is one split: the balanced kernel's own cost)
BAL_LONG_PAGED_TILES = 64
BAL_WAVE_ROWS_PER_UNIT = 8
_MAX_SPLITS = 128   # the last-CTA merge keeps one weight per (head, split) in shared memory
_LAST_UNROLL = 8    # splits whose partial rows the last-CTA merge loads before any is accumulated
#: values of partial O a thread of the last CTA holds in flight in one round of the merge's loads (merge_unroll): at 64
#: ptxas (sm_90a) keeps every split_last plan's registers (102-146), at 128 they grow to 166-174 (H100, iteration 53:
#: 1.009-1.012x where one round replaced two)
MERGE_VALUES = 64


def merge_unroll(G: int, d: int, threads: int, num_splits: int) -> int:
    """Splits the last CTA of a uniform split plan loads in one round: all of them where a thread's share (merge_rows x
    d / threads values a split) stays within MERGE_VALUES registers, else as many as fit, at least _LAST_UNROLL."""
    per = max(1, merge_rows(G, d, threads) * d // threads)
    return max(_LAST_UNROLL, min(num_splits, MERGE_VALUES // per))


def merge_rows(G: int, d: int, threads: int) -> int:
    """Rows of the last-CTA merge's fragments ([rows, d] partial sums, [rows, _MAX_SPLITS] weights): G, or, where
    G x d values do not spread evenly over the CTA's threads (more values than threads, not a multiple of them),
    G rounded up until they do. TileLang finds no fragment layout for the uneven case (GQA 3, 5, 7, ... at head
    dim 64 on 128 threads: 'no available layout found', on CUDA and on a wave64 HIP target alike); the extra rows
    repeat row G - 1 and are never written. Where G already spreads evenly (every H200 bench plan) nothing changes."""
    if G * d <= threads or (G * d) % threads == 0:
        return G
    step = threads // math.gcd(d, threads)
    return -(-G // step) * step


def _last_cta_macro(T, accum: str, dtype: str, G: int, d: int, unroll: int = 0, threads: int = 128):
    """The merge done by the last CTA of a (batch, kv head) to finish, inside the split kernel: no
    second kernel launch, and the partials it reads were written moments ago (L2 hits).

    Every CTA publishes its partial O and LSE (writes, fence, barrier, then one acq_rel atomic on the
    (batch, kv head) counter by thread 0). The CTA that sees count nsplit - 1 is the last: it turns the
    G x nsplit LSE values into weights 2^(lse - lse_total) (a [G, 128] fragment, row max and row sum
    reductions), then accumulates O = sum_s w[i, s] * O_s[i, :] over the splits, ``unroll`` splits of
    loads in flight at a time (a uniform plan's merge_unroll: all of its splits where they fit; the balanced
    kernel's _LAST_UNROLL), and resets the counter to 0 for the next call (all other CTAs of this
    (batch, kv head) have counted by then, and calls are ordered on the stream). Its fragments hold
    merge_rows(G, d, threads) rows."""
    S = _MAX_SPLITS
    U = unroll or _LAST_UNROLL
    R = merge_rows(G, d, threads)
    padded = R != G

    def head(i):  # a padded row repeats the last head (read, never written)
        return T.min(i, G - 1) if padded else i

    @T.macro
    def merge_last(Opart, LSE, Cnt, Out, h, b, nsplit):
        prev = T.alloc_shared([1], "int32")
        W = T.alloc_shared([R, S], accum)
        lse_f = T.alloc_fragment([R, S], accum)
        lmax = T.alloc_fragment([R], accum)
        lsum = T.alloc_fragment([R], accum)
        o_f = T.alloc_fragment([R, d], accum)
        tx = T.get_thread_binding()
        T.call_extern("handle", "__threadfence")
        T.sync_threads()
        if tx == 0:
            prev[0] = T.atomic_add(Cnt[b, h], 1, memory_order="acq_rel", return_prev=True)
        T.sync_threads()
        if prev[0] == nsplit - 1:
            T.call_extern("handle", "__threadfence")
            for i, sp in T.Parallel(R, S):
                lse_f[i, sp] = T.if_then_else(sp < nsplit, LSE[b, h * G + head(i), T.min(sp, nsplit - 1)],
                                              -T.infinity(accum))
            T.reduce_max(lse_f, lmax, dim=1)
            for i in T.Parallel(R):  # every split empty (a zero-length sequence): weights 0, output 0
                lmax[i] = T.if_then_else(lmax[i] == -T.infinity(accum), 0.0, lmax[i])
            for i, sp in T.Parallel(R, S):
                lse_f[i, sp] = T.exp2(lse_f[i, sp] - lmax[i])
            T.reduce_sum(lse_f, lsum, dim=1)
            for i, sp in T.Parallel(R, S):
                W[i, sp] = T.if_then_else(lsum[i] > 0, lse_f[i, sp] / lsum[i], 0.0)
            T.fill(o_f, 0)
            for c in T.serial(T.ceildiv(nsplit, U)):
                for u in T.unroll(U):
                    for i, j in T.Parallel(R, d):
                        o_f[i, j] += W[i, c * U + u] * Opart[b, h * G + head(i), T.min(c * U + u, nsplit - 1), j]
            if padded:
                for i, j in T.Parallel(R, d):
                    if i < G:
                        Out[b, h * G + i, j] = T.cast(o_f[i, j], dtype)
            else:
                for i, j in T.Parallel(G, d):
                    Out[b, h * G + i, j] = T.cast(o_f[i, j], dtype)
            if tx == 0:
                Cnt[b, h] = 0

    return merge_last


def _combine_macro(T, accum: str, dtype: str, unroll: int = 0, lse_smem: bool = False, nthreads: int = 0):
    """Body of the combine kernel, one CTA of d threads per (batch, query head); thread tx owns
    output column tx. One pass over the splits in chunks of _COMBINE_UNROLL: a chunk's LSE and
    partial-O values are all loaded before any is used (independent loads in flight instead of one
    dependent load per split), then merged with a running max (online softmax). Indices past the
    last split are clamped and get weight 0.

    ``lse_smem`` (CUDA, ``nthreads`` threads a CTA): the chunk's LSE values are loaded once per CTA into shared
    memory (a thread a split) in the same round trip as each thread's partial-O values, and read from there, so a
    thread holds U partial-O registers, not U LSE values as well (ptxas, sm_90a: 126 registers at 32 splits a
    round trip, 198 at 48 and 231 at 64 without it), and a wide chunk still fits beside two split CTAs."""
    U = unroll or _COMBINE_UNROLL
    if lse_smem and not nthreads:
        raise ValueError("lse_smem needs the CTA's thread count (nthreads)")

    @T.macro
    def combine_body(Opart, LSE, Out, hh, b, num_splits, tx):
        if lse_smem:
            lse_c = T.alloc_shared([U], accum)
        else:
            lse_c = T.alloc_local([U], accum)
        o_c = T.alloc_local([U], accum)
        m = T.alloc_var(accum)
        m_new = T.alloc_var(accum)
        sc = T.alloc_var(accum)
        lsum = T.alloc_var(accum)
        acc = T.alloc_var(accum)
        m = -T.infinity(accum)
        lsum = 0.0
        acc = 0.0
        for c in T.serial(T.ceildiv(num_splits, U)):
            if lse_smem:  # a thread a split: the chunk's LSE stored once for the CTA
                for i in T.serial(T.ceildiv(U, nthreads)):
                    if i * nthreads + tx < U:
                        lse_c[i * nthreads + tx] = T.if_then_else(
                            c * U + i * nthreads + tx < num_splits,
                            LSE[b, hh, T.min(c * U + i * nthreads + tx, num_splits - 1)], -T.infinity(accum))
            for u in T.unroll(U):
                if not lse_smem:
                    lse_c[u] = T.if_then_else(c * U + u < num_splits, LSE[b, hh, T.min(c * U + u, num_splits - 1)],
                                              -T.infinity(accum))
                o_c[u] = Opart[b, hh, T.min(c * U + u, num_splits - 1), tx]
            if lse_smem:
                T.sync_threads()
            m_new = m
            for u in T.unroll(U):
                m_new = T.max(m_new, lse_c[u])
            if m_new > -T.infinity(accum):
                sc = T.exp2(m - m_new)  # 0 while m is still -inf
                lsum = lsum * sc
                acc = acc * sc
                for u in T.unroll(U):
                    lsum += T.exp2(lse_c[u] - m_new)  # an empty split (lse -inf) weighs 0
                    acc += T.exp2(lse_c[u] - m_new) * o_c[u]
                m = m_new
            if lse_smem:
                T.sync_threads()  # every thread has read this chunk's LSE before the next one is stored
        Out[b, hh, tx] = T.cast(T.if_then_else(lsum > 0, acc / lsum, 0.0), dtype)

    return combine_body


def build_combine_serial(hq: int, d: int, unroll: int = 0):
    """The combine kernel's body with a serial loop over the output columns instead of a thread
    per column: the same merge arithmetic as a C-target kernel, so CPU tests can run it."""
    import tilelang.language as T

    accum = "float32"
    batch = T.dynamic("batch")
    num_splits = T.dynamic("num_splits")
    combine_body = _combine_macro(T, accum, accum, unroll)

    @T.prim_func
    def combine_serial(
        Opart: T.Tensor([batch, hq, num_splits, d], accum),
        LSE: T.Tensor([batch, hq, num_splits], accum),
        Out: T.Tensor([batch, hq, d], accum),
    ):
        with T.Kernel(hq, batch) as (hh, b):
            for tx in T.serial(d):
                combine_body(Opart, LSE, Out, hh, b, num_splits, tx)

    return combine_serial


def build_combine(dtype: str, hq: int, d: int, pdl: bool = False, unroll: int = 0):
    """The combine kernel alone (the second kernel of decode_split_combine, for GPU-less checks of its registers):
    O = sum_s 2^(lse_s - lse) * O_s with lse = log2 sum_s 2^lse_s. ``pdl``: launched as a programmatic dependent of
    the split kernel, it waits for it before the first read. ``unroll``: splits loaded at once per thread (0:
    _COMBINE_UNROLL); the LSE values go through shared memory (_combine_macro's lse_smem)."""
    import tilelang.language as T

    accum = "float32"
    batch = T.dynamic("batch")
    num_splits = T.dynamic("num_splits")
    combine_body = _combine_macro(T, accum, dtype, unroll, lse_smem=True, nthreads=d)

    @T.prim_func
    def combine(
        Opart: T.Tensor([batch, hq, num_splits, d], accum),
        LSE: T.Tensor([batch, hq, num_splits], accum),
        Out: T.Tensor([batch, hq, d], dtype),
    ):
        with T.Kernel(hq, batch, threads=d) as (hh, b):
            if pdl:
                T.pdl_sync()
            combine_body(Opart, LSE, Out, hh, b, num_splits, T.get_thread_binding())

    return combine


# ----------------------------------------------------------------------------------------------
# the plan's rules: tiles, splits and the derived switches, each with the measurement behind it
# ----------------------------------------------------------------------------------------------
#: the merge in the last CTA (last_cta) by default when it reads at most this many partial rows (G x num_splits): one
#: CTA per (batch, kv head) pulls them alone, so large merges are faster in the combine kernel's B x Hq CTAs (H200:
#: case 10, G 8 x 32 splits, +1.8 us in-kernel; case 8, G 8 x 4, and 13, G 4 x 33, faster). The same rule for the
#: balanced kernel's rows of up to num_splits splits. On a device with dependent launch a uniform split plan merges in
#: the combine kernel whatever its rows (last_cta_default; iteration 61, H200: floor-bound calls 1.05-1.28x).
LAST_CTA_MAX_ROWS = 160


def combine_rows(target: int, hkv: int, G: int) -> int:
    """The most rows of a balanced plan that can need its combine kernel (more than LAST_CTA_MAX_ROWS partial rows,
    so at least max(1, LAST_CTA_MAX_ROWS // G) extra splits each) when the rows' extra splits together never exceed
    the pool, ceil(target / hkv): the combine grid's rows, not the batch (an equal-rows draw, 256 rows in 16 query
    heads: 4096 combine CTAs, every one idle, about 10 us after the split grid on an H100)."""
    return max(1, -(-target // hkv) // max(1, LAST_CTA_MAX_ROWS // G))


#: the widest one-tile range (choose_tiling): an unsplit range of 65-192 keys runs as one tile of its length
#: rounded up to TILE_STEP keys
WIDE_TILE = 192
#: one-tile ranges are rounded up to a multiple of this many keys (a T.gemm of 4 warps splits N in 4 x 8 columns)
TILE_STEP = 32
#: bytes of K a one-tile grid may read past 64 keys a row, for each 64-key round trip the one tile saves
#: (choose_tiling): an eager one-tile CTA reads its whole allocated range before it knows the row's length, and rows
#: shorter than the range pay for the rest. H100, iteration 58: 1 MiB (128 rows x 32 keys x 256 B) gained 2.5%,
#: 2 MiB for one round trip (128 rows x 64 keys) lost 4.6%; 4-64 rows gained 6-28%
ONE_TILE_TRIP_BYTES = 1 << 20


#: eager (Q and the first K tile before L[b]) by default when a CTA streams at most this many tiles: it
#: saves part of one DRAM latency per CTA, and costs a 4 KB L2 read of Q per further tile.
EAGER_MAX_TILES = 8
#: CTAs a unit past which a grid streams its bytes at the device's rate rather than waiting on one CTA's chain
#: (k_clamp_default). H100, session 20: eager off on grids past it gained 1.04-1.09x on ragged paged batches of
#: 512-8192 CTAs and lost 0.5-1.3% on equal rows; on 128-256 CTAs (1-2 a unit) it lost up to 4%
BUSY_CTAS_PER_UNIT = 2


def k_clamp_default(paged: bool, eager: bool, ctas: int, units: int) -> bool:
    """Clamp an eager paged plan's first K tile to the sequence (k_clamp) on a busy grid (more than
    BUSY_CTAS_PER_UNIT CTAs a unit): its row offsets then wait for L[b], which is read beside the block table the
    tile's pages wait for anyway, so no round trip is added, and a row shorter than the tile re-reads one offset a
    page instead of streaming the rest of the allocated tile. A busy grid's time is its bytes; a latency-bound grid
    (at most BUSY_CTAS_PER_UNIT a unit) keeps the address free of L[b] (iteration 72: 0.97-0.99x there)."""
    return paged and eager and ctas > BUSY_CTAS_PER_UNIT * max(1, units)


def last_cta_default(G: int, num_splits: int, balanced: bool = False, dependent_launch: bool = False) -> bool:
    """The merge in the last CTA by default: where it reads at most LAST_CTA_MAX_ROWS partial rows (and the merge's
    weights fit: at most _MAX_SPLITS splits), on a balanced plan or a device without programmatic dependent launch;
    else a combine kernel. With dependent launch a uniform split plan always merges in the combine kernel: it is
    resident while the splits run, so the merge waits neither for a split's fence and arrival atomic nor for one CTA
    reloading G x splits partial rows in series (iteration 61: floor-bound split calls 1.05-1.28x on the H200)."""
    if dependent_launch and not balanced:
        return False
    return G * num_splits <= LAST_CTA_MAX_ROWS and num_splits <= _MAX_SPLITS


def v_split_default(batch: int, hkv: int, num_splits: int, num_sms: int) -> int:
    """v_split (build_decode) by default: 2 for an unsplit plan whose CTAs, two a (batch, kv head) row, still fit
    one a unit; else 1. H200, iteration 21 (gain = one CTA a row / two): case 5 (64 rows) 4.45 -> 4.32 us (1.026),
    case 2 1.046, case 1 1.044, case 3 1.005; where the two CTAs a row no longer fit one a unit it loses (case 6, 128
    rows: 0.928; case 4, 512 rows: 0.898)."""
    return 2 if num_splits == 1 and 2 * batch * hkv <= num_sms else 1


def default_threads(block_N: int, v_split: int, warp_size: int = 32) -> int:
    """Threads of a CTA by default: two warps (64 threads at a warp of 32) for a tile of at most TILE_STEP keys on a
    few-row grid (v_split 2: one row on two CTAs), else 128 (at wave64 both are 128: two waves). The tile's QK^T is
    then two 16 x 16 MMAs, not four of 16 x 8, and its row max and row sum cross two warps, not four. H200, iteration
    22 (gain = four warps / two): case 3 3.20 -> 2.94 us (1.087), case 2 1.049; with 64-key or wider tiles two warps
    lose (case 1's tuned 64-key tile 0.962, case 5 0.911, case 4 0.938, case 6 0.848)."""
    return max(2 * warp_size, 64) if block_N <= TILE_STEP and v_split == 2 else max(2 * warp_size, 128)


def tile_rows_per_thread(warp_size: int) -> int:
    """Rows of a 16-row tile's accumulator that one thread holds, as TileLang lays out T.gemm's fragment: 2 at a warp
    of 32 (CUDA's m16n8k16 MMA: lane l holds rows l / 4 and l / 4 + 8), 1 at wave64 (TileLang's HIP MFMA layout: a
    reduce ``batch`` of 2 fails there, 'ReduceOp: batch=2 exceeds per-thread output element count N=1')."""
    return 2 if warp_size == 32 else 1


def red_batch_default(block_N: int, eager: bool, warp_size: int = 32) -> int:
    """red_batch (build_decode) by default: RED_BATCH (both of a thread's rows through one butterfly) where the
    softmax's barriers sit on a short CTA's critical path (eager plans: at most EAGER_MAX_TILES tiles a CTA) or
    the tiles are narrow; 1 on long streams of 128-key tiles. H200, iteration 23 (gain = batched / one row at a
    time): cases 1-6 0.950-0.984, cases 8, 13 and R1 (64-key tiles) 0.994-0.996; case 14 (15 128-key tiles a CTA)
    1.008 and R4 1.004: those keep one row at a time. Case 10 (eager, two 128-key tiles a split) took 1 in
    iteration 25 (1.004-1.007); under fast math (iteration 29's screen) batched is 1.019 faster (CI 1.013-1.023)
    there, case 14 still 0.997. A thread that holds one row (tile_rows_per_thread: wave64) takes 1."""
    if tile_rows_per_thread(warp_size) < RED_BATCH:
        return 1
    return RED_BATCH if eager or block_N < 128 else 1


def red_once_default(split: bool, eager: bool, nvcc: bool = True, warp_size: int = 32) -> bool:
    """red_once (build_decode) by default: on, except on an eager split plan (a split range of few tiles with
    its combine kernel: case 10). H200, iteration 24 (gain = one round / two): case 3 1.032, case 2 1.011, case 5
    1.010 (4.25 -> 4.19 us), case 4 1.009, case 6 1.008, cases 8, 13, R1, R4 1.003-1.006, case 14 0.998; case 10
    0.950-0.961 (0.966 without PDL, so not the dependent launch; 170 registers against 186: a different schedule).
    Only where nvcc builds TileLang's CUDA templates at a warp of 32 (the prelude specializes that template for four
    warps of 32): off on MACA (mcPytorch: the fork's own templates), HIP and any wave64 device."""
    return not (split and eager) and bool(nvcc) and warp_size == 32


def tile_page_applies(paged: bool, page_size: int, block_N: int, eager: bool) -> bool:
    """Where _decode_body's tile_page can run, and the plan runs it (iteration 34): a paged, non-eager plan (eager rows
    may pass the sequence and keep their per-row clamped page) whose pages hold whole tiles or whose tiles hold whole
    pages."""
    return bool(paged) and not eager and (page_size % block_N == 0 or block_N % page_size == 0)


def even_split_default(balanced: int, page_size: int) -> bool:
    """even_split (build_decode) by default: on balanced plans in pages of at most BAL_WIDE_MAX_PAGE tokens (128-key
    tiles at two CTAs a unit), off elsewhere. H200, iteration 37's screen (gain = ceil ranges / even ones): 16-token
    pages R4 1.030 (its 481 tiles in 60 splits: 54 of 9 tiles and 6 empty, against one of 9 and 59 of 8), R3 1.014, R1
    1.006, R2 0.999; where it puts work on pool blocks that the ceil ranges left idle it loses: contiguous R4 (128-key
    tiles at one CTA a unit) 0.891, 256-token R4 0.973, case 13 0.990."""
    return bool(balanced) and 0 < page_size <= BAL_WIDE_MAX_PAGE


#: splits a combine thread loads at once by default where a plan's rows may hold at least COMB_WIDE_MIN_SPLITS splits
#: (comb_unroll_default): one round trip for R3/R4's 60-67 splits in 16- and 256-token pages (ptxas sm_90a: 156
#: registers with the LSE values through shared memory, so the combine CTA still fits beside two split CTAs; 231
#: without)
COMB_WIDE_UNROLL = 64
#: the fewest splits a plan may hold (its num_splits) for COMB_WIDE_UNROLL by default: balanced plans at two CTAs a unit
#: of at most four KV heads hold up to 67; contiguous R3/R4's one-CTA-a-unit plan holds 34 and R4 uses 32, where 64 a
#: round trip only loads clamped copies of the last split (iteration 37: contiguous R4 36.26 us against 35.97)
COMB_WIDE_MIN_SPLITS = 48


def comb_unroll_default(num_splits: int, combine: bool) -> int:
    """comb_unroll by default: COMB_WIDE_UNROLL for a plan with a combine kernel of at least COMB_WIDE_MIN_SPLITS
    splits, else 0 (_COMBINE_UNROLL). H200, iteration 37's screen (gain over 32 splits a round trip): R4 in 16-token
    pages 1.020 (1.052 with even_split), in 256-token pages 1.018, R3 1.014 / 1.003; over at most 32 splits it only
    costs (case 10 0.942, case 14 0.996)."""
    return COMB_WIDE_UNROLL if combine and num_splits >= COMB_WIDE_MIN_SPLITS else 0


def fast_math_default(nvcc: bool = True) -> bool:
    """fast_math: wherever nvcc builds the kernels (its paired screen on the H200: ITERATIONS.md, iteration 28). The
    output's division by the row sum becomes div.approx (div.rn is a call of a few dozen instructions at the end of
    every CTA) and denormals flush to zero; exp2 is ex2.approx either way. Off on MACA (mcPytorch) and HIP, whose
    compilers take their own flags."""
    return bool(nvcc)


def rows_fill(rows: int, target: int) -> bool:
    """Whether a batch's (row, kv head) CTAs alone fill three quarters of a grid of `target` CTAs: then neither the
    uniform split rule nor the balanced kernel's small-call rule splits rows."""
    return 4 * rows >= 3 * target


#: what a merge costs, in tiles of a split's chain, and what each extra CTA on a unit costs: the floor-bound model
#: (H200, the 14 held-out draws at the launch floor: t ~ 2.64 + 0.52 x chain + 2.31 x merge + 1.13 x CTAs a unit us,
#: so a merge is 2.31 / 0.52 = 4.4 tiles and a CTA a unit 2.2). num_splits_heuristic splits only where the chain it
#: saves exceeds them (iteration 60, H100: the six plans it changed gained 1.03-1.54x). Fitted on mostly last-CTA
#: merges; the combine merge with dependent launch (iteration 61) is not refitted.
MERGE_TILES = 4.4
UNIT_TILES = 2.2


def num_splits_heuristic(batch: int, hkv: int, seqlen: int, block_N: int, num_sms: int, max_splits: int = 128,
                         ctas_per_sm: int = 2, min_tiles: int = 8, min_tiles_per_split: int = 2, gqa: int = 0) -> int:
    """Split count in the spirit of FlashAttention's num_splits_heuristic.

    A decode CTA streams K/V of one (batch, kv_head); several CTAs per SM are needed to keep enough
    bytes in flight, so aim for about ``ctas_per_sm * num_sms`` CTAs in total. No split when
    batch * kv_heads already fills the machine (>= 3/4 of the target) or the sequence is short
    (< ``min_tiles`` KV tiles: the extra combine launch costs more than it saves); at least
    ``min_tiles_per_split`` KV tiles per split, and the count is rebalanced so that no split is
    left empty. With the GQA ratio (``gqa``), where the merge of that count is small (at most LAST_CTA_MAX_ROWS partial
    rows, the bound of a last-CTA merge: last_cta_default on a device without dependent launch), the count grows to
    one CTA a unit (num_sms // rows) if that shortens a split's chain of tiles: a small call's time is its longest
    chain, and past one CTA a unit more splits only add each CTA's fixed work (H100, iteration 53: 6-38%
    on every unseen draw it changes; one tile a split at 184-256 CTAs lost 4-10%).
    """
    base = batch * hkv
    n_tiles = max(1, -(-seqlen // block_N))
    target = ctas_per_sm * num_sms
    if rows_fill(base, target) or n_tiles < min_tiles:
        return 1
    ns = max(1, min(max_splits, n_tiles // min_tiles_per_split, round(target / base)))
    if gqa and ns > 1 and last_cta_default(gqa, ns):
        # up to one CTA a unit, more splits shorten a row's chain of tiles (the small call's time); past it they only
        # add merge work
        wide = min(max_splits, n_tiles, num_sms // base)
        if wide > ns and -(-n_tiles // wide) < -(-n_tiles // ns):
            ns = wide
    per = -(-n_tiles // ns)
    ns = max(1, -(-n_tiles // per))
    # a merge costs MERGE_TILES tiles of chain, and each extra CTA a unit UNIT_TILES more (the floor-bound model):
    # split only where the split chain is shorter by more than that
    extra = base * (ns - 1) / num_sms
    if ns > 1 and n_tiles - per <= MERGE_TILES + UNIT_TILES * extra:
        return 1
    return ns


#: shared memory a decode CTA holds beyond its tiles (smem_bytes): reduction workspaces and alignment, 1-2 KB in the
#: lowered kernels (sm_90a and HIP gfx942 alike)
SMEM_SLACK = 4096
#: the widest tile any rule picks (configs() offers up to 128; a one-tile range up to WIDE_TILE)
MAX_TILE = 256


def smem_bytes(G: int, d: int, block_N: int, v_split: int = 1, merge: bool = False, threads: int = 128,
               dtype_bytes: int = 2) -> int:
    """Shared memory of one decode CTA, bytes, an upper bound: the Q, K, V and P tiles (block_H x d, block_N x d,
    block_N x d / v_split, block_H x block_N) plus SMEM_SLACK, plus, with ``merge`` (last CTA or balanced), the
    merge's weights (merge_rows x _MAX_SPLITS fp32; the lowered kernels reuse the tiles' space for it, this does not
    count on that). Lowered for sm_90a and for HIP gfx942 a CTA takes 40 KB at head dim 128 and 64-key tiles, 74 KB
    at 128-key tiles: more than a 64 KB unit holds."""
    block_H = _block_h(G)
    tiles = dtype_bytes * (block_H * d + block_N * d + block_N * (d // max(1, v_split)) + block_H * block_N)
    return tiles + SMEM_SLACK + (merge_rows(G, d, threads) * _MAX_SPLITS * 4 + 4 if merge else 0)


def widest_tile(G: int, d: int, smem_per_unit: int, merge: bool = False, threads: int = 128) -> int:
    """The widest tile, a multiple of TILE_STEP keys up to MAX_TILE, whose CTA (smem_bytes) fits a unit's shared
    memory; MAX_TILE where that size is unknown (0). An H200's 228 KB holds every tile; a C500's 64 KB holds 96 keys
    at head dim 128 (so no 128-key or wide one-tile plans there) and 192 at head dim 64."""
    if not smem_per_unit:
        return MAX_TILE
    fit = [bn for bn in range(TILE_STEP, MAX_TILE + 1, TILE_STEP)
           if smem_bytes(G, d, bn, 1, merge, threads) <= smem_per_unit]
    return fit[-1] if fit else TILE_STEP


def choose_tiling(batch: int, hkv: int, max_seqlen: int, num_sms: int, block_N: int = 0, num_splits: int = 0,
                  max_tile: int = MAX_TILE, gqa: int = 0, d: int = 128):
    """(block_N, num_splits): explicit values win. Otherwise 64-key tiles, except, when one CTA per
    (batch, kv_head) streams the whole range and those CTAs are no more than the units, 128-key tiles
    for a longer range (> 256 keys) and one tile for a range of 65-192 keys. One CTA on a unit
    keeps more bytes in flight with bigger tiles, while several CTAs per unit want the smaller tile's
    occupancy (H200, fp16, D 128: 168 registers and 73 KB of shared memory, 3 CTAs per SM, at 128 keys;
    126 registers and 39 KB, 4 per SM, at 64 keys: case 7's 512 CTAs take 1.29 waves with 128-key tiles
    and one with 64). A range of one 192-key tile waits for one K round trip where 64-key tiles chain
    three (H200, iteration 13: case 5, 141 keys, 5.31 -> 4.74 us; two 128-key tiles were 6.21, one of 256
    slower still; iteration 58: a range of 65-128 keys as one tile of 96 or 128 instead of two of 64, 1.06-1.28x on 11
    unseen draws of 4-128 rows). A one-tile range's tile is its length rounded up to TILE_STEP keys (65-128 keys: 96 or
    128; 129-192: 160 or 192; at most 32 keys: 32), so that it asks for few rows past the sequence: each such row
    re-reads the last key. The K rows a short row's eager tile reads past 64 keys, over the grid (d-wide, 2 bytes), stay
    within ONE_TILE_TRIP_BYTES for each 64-key round trip the tile saves; else 64-key tiles.
    ``max_tile`` (widest_tile): a wider tile than a unit's shared memory holds is never picked (64-key tiles then)."""
    bn = block_N or min(64, max_tile)
    ns = num_splits or num_splits_heuristic(batch, hkv, max_seqlen, bn, num_sms, gqa=gqa)
    step = -(-max_seqlen // TILE_STEP) * TILE_STEP
    if not block_N and ns == 1 and max_seqlen > 256 and batch * hkv <= num_sms and 128 <= max_tile:
        bn = 128
    elif (not block_N and ns == 1 and 64 < max_seqlen <= WIDE_TILE and batch * hkv <= num_sms and step <= max_tile
          and batch * hkv * (step - 64) * d * 2 <= (-(-step // 64) - 1) * ONE_TILE_TRIP_BYTES):
        bn = step
    elif not block_N and ns == 1 and max_seqlen <= TILE_STEP:
        bn = TILE_STEP
    ns = max(1, min(ns, -(-max_seqlen // bn)))
    return bn, ns


# ----------------------------------------------------------------------------------------------
# compile
# ----------------------------------------------------------------------------------------------
def fast_call(kernel):
    """The compiled kernel's TVM-FFI executable (all buffers passed positionally, no output
    allocation): skips the generic Python argument wrapper of JITKernel.__call__. Other execution
    backends are returned unchanged."""
    adapter = getattr(kernel, "adapter", None)
    if getattr(kernel, "execution_backend", None) == "tvm_ffi" and hasattr(adapter, "_get_executable") \
            and not getattr(adapter, "result_idx", None):
        return adapter._get_executable()
    return kernel


# ----------------------------------------------------------------------------------------------
# compile
# ----------------------------------------------------------------------------------------------
def cuda_target(device=None, arch: str = ""):
    """The TileLang target of a CUDA device (torch's), or of an arch ("sm_90a") with no device; sm_90a by default.
    The two give the same target for the same arch, so a kernel built for an arch is the one the device loads."""
    import tilelang  # noqa: F401  (sets up the bundled tvm)
    from tvm.target import Target

    if device is not None:
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"sm_{major}{minor}" + ("a" if major >= 9 else "")
    return Target({"kind": "cuda", "arch": arch or "sm_90a"})


def _compile(func, target, fast_math: bool = False):
    import tilelang

    return tilelang.compile(func, target=target, pass_configs=_pass_configs(fast_math))


def get_decode(p: Plan, target):
    """The compiled kernel of a plan for a target, built once per process (Plan.build_key)."""
    key = ("decode", str(target), p.build_key())
    k = _KERNELS.get(key)
    if k is None:
        with _LOCK:
            k = _KERNELS.get(key)
            if k is None:
                k = _compile(build_decode(p), target, p.fast_math)
                _KERNELS[key] = k
    return k


# ----------------------------------------------------------------------------------------------
# GPU-less lowering / nvcc checks
# ----------------------------------------------------------------------------------------------
def _pass_configs(fast_math: bool = False):
    """TileLang pass configs of every kernel here; ``fast_math``: nvcc's --use_fast_math (approximate division,
    denormals flushed to zero), as FlashAttention builds its kernels (the fast_math config, fast_math_default)."""
    from tilelang.transform import PassConfigKey

    # every global index is clamped in-bounds by construction (keys past the sequence end are
    # clamped to the last valid key, page ids come from block_table), so skip the generic guards
    cfg = {PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True}
    if fast_math:
        cfg[PassConfigKey.TL_ENABLE_FAST_MATH] = True
    return cfg


def _as_target(target):
    """A TileLang/TVM Target from a CUDA arch ("sm_90a"), a target dict ({"kind": "hip", "mcpu": "gfx942"}) or a
    Target."""
    import tilelang  # noqa: F401  (sets up the bundled tvm)
    from tvm.target import Target

    if isinstance(target, Target):
        return target
    if isinstance(target, str) and target.startswith("sm_"):
        return Target({"kind": "cuda", "arch": target})
    return Target(target)


def _lower_source(func, arch, compile_device: bool = False) -> tuple:
    """(device source, largest dynamic shared memory of its kernels) of a prim_func lowered for `arch` (a CUDA arch
    or any target _as_target takes), without a device."""
    import tilelang

    target = _as_target(arch)
    with tilelang.transform.PassContext(config=_pass_configs()), target:
        art = tilelang.lower(func, target=target, enable_device_compile=compile_device)
    smem = 0
    for _, f in art.device_mod.functions.items():
        if f.attrs is not None and "dyn_shared_memory_buf" in f.attrs:
            smem = max(smem, int(f.attrs["dyn_shared_memory_buf"]))
    return art.kernel_source, smem


_LOWERED: dict = {}

def lower(p: Plan, target) -> dict:
    """A plan's kernel lowered for any TileLang target (a CUDA arch such as "sm_90a", {"kind": "hip", "mcpu":
    "gfx942"}, a Target), without a device, cached in-process: {"main": {"source", "dyn_smem_bytes"}} (a combine
    kernel that follows is in the same source)."""
    key = (str(_as_target(target)) if not isinstance(target, str) else target, p.build_key())
    r = _LOWERED.get(key)
    if r is None:
        r = _lower_source(build_decode(p), target)
        _LOWERED[key] = r
    return {"main": {"source": r[0], "dyn_smem_bytes": r[1]}}


def lower_kernels(target, **shape) -> dict:
    """lower() of kernel_plan(**shape)."""
    return lower(kernel_plan(**shape), target)


def build_cuda_source(arch="sm_90a", **shape) -> str:
    """CUDA C++ of kernel_plan(**shape)'s kernels for `arch`, lowered without a GPU."""
    return lower_kernels(arch, **shape)["main"]["source"]


def _nvcc_cubin(source: str, arch: str) -> dict:
    """nvcc-compile one CUDA source to cubin through tilelang's nvcc helper (ptxas -v captured
    from its log); returns size, registers and spill bytes."""
    import logging
    import re

    import tilelang
    from tilelang.contrib import nvcc as tl_nvcc

    sm = arch.removeprefix("sm_")
    records = []

    class _Grab(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    grab = _Grab(level=logging.INFO)
    log = tilelang.logger
    old_level = log.level
    log.addHandler(grab)
    log.setLevel(logging.INFO)
    try:
        cubin = tl_nvcc.compile_cuda(source, "cubin", ["-gencode", f"arch=compute_{sm},code=sm_{sm}"],
                                     options=tl_nvcc.default_compile_options(["-std=c++20", "-w", "-Xptxas", "-v"]),
                                     verbose=True)
    finally:
        log.removeHandler(grab)
        log.setLevel(old_level)
    text = "\n".join(records)
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", text)]
    spills = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)]
    return {"cubin_bytes": len(cubin), "registers": regs, "spill_bytes": spills, "ptxas_log": text}


def compile_combine_check(dtype: str = "float16", hq: int = 32, d: int = 128, pdl: bool = True, unroll: int = 0,
                          arch: str = "sm_90a") -> dict:
    """Lower the combine kernel alone (build_combine) for `arch` and nvcc-compile it (no GPU): cubin_bytes, registers,
    spill_bytes, ptxas_log, dyn_smem_bytes, source."""
    src, dyn = _lower_source(build_combine(dtype, hq, d, pdl, unroll), arch)
    return dict(_nvcc_cubin(src, arch), dyn_smem_bytes=dyn, source=src)


def compile_cuda_check(arch="sm_90a", **shape) -> dict:
    """Lower kernel_plan(**shape)'s kernel for `arch` and nvcc-compile it to cubin; needs nvcc, no GPU. Returns
    {"main": cubin_bytes, registers, spill_bytes (per kernel of the module), ptxas_log, dyn_smem_bytes, source}."""
    main = lower_kernels(arch, **shape)["main"]
    return {"main": dict(_nvcc_cubin(main["source"], arch), dyn_smem_bytes=main["dyn_smem_bytes"],
                         source=main["source"])}
