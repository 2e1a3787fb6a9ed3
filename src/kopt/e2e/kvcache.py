"""The KV cache the decode attention reads, owned by kopt's attention backend (as vLLM's transformers backend owns
its cache): preallocated per layer in the layout a kernel takes, contiguous [B, S, Hkv, D] or shuffled pages
[num_blocks, page, Hkv, D] with one block table for every layer. Each step writes only its new token's K and V
(an index_put at each sequence's position, graph-safe); nothing copies the whole cache per step.

`attention` is the function registered in transformers' attention registry: the prefill runs the library's own
SDPA attention (and fills the cache), a decode step calls the active decode function on the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

#: The name kopt's attention backend is registered under in transformers.
ATTN_NAME = "kopt_e2e"


class CandidateFailure(Exception):
    """A decode function raised or returned something the model cannot use (the message says where): the
    candidate's `run`, or (`who`) the baseline's or the reference's."""

    def __init__(self, message: str, who: str = "candidate"):
        super().__init__(message)
        self.who = who


@dataclass
class Store:
    """Per-layer K and V in one layout, the block table, and each sequence's position on the device."""

    k: list
    v: list
    block_table: Optional[object]   # [B, pages] int32, or None (contiguous)
    pos: object                     # [B] int64: the position the next token is written at (= tokens cached)
    seqlens: object                 # [B] int32: pos + 1 during a decode step (what the kernel reads)

    @property
    def page(self) -> Optional[int]:
        """Tokens per page (None: contiguous)."""
        return None if self.block_table is None else int(self.k[0].shape[1])

    def write(self, layer: int, key, value, start: Optional[int] = None) -> None:
        """Write key / value [B, Hkv, T, D] at each sequence's position (a decode step, T = 1) or at start.."start+T
        (the prefill); only those rows are touched."""
        import torch

        kc, vc = self.k[layer], self.v[layer]
        b, _, t, _ = key.shape
        kn, vn = key.transpose(1, 2), value.transpose(1, 2)             # [B, T, Hkv, D]
        if start is None:
            pos = self.pos.view(b, 1)
        else:
            pos = torch.arange(start, start + t, device=kc.device).view(1, t).expand(b, t)
        rows = torch.arange(b, device=kc.device).view(b, 1).expand(b, t)
        if self.block_table is None:
            kc.index_put_((rows, pos), kn)
            vc.index_put_((rows, pos), vn)
            return
        page = kc.shape[1]
        blocks = self.block_table.long()[rows, pos // page]
        kc.index_put_((blocks, pos % page), kn)
        vc.index_put_((blocks, pos % page), vn)

    def contiguous(self, layer: int):
        """(K, V) of one layer as contiguous [B, S, Hkv, D] (gathers the pages: for building other layouts and for
        the fp32 reference, never on the timed path)."""
        from kopt.workload import Workload

        return Workload(None, self.k[layer], self.v[layer], self.seqlens, self.block_table, 1.0, 0).logical_kv()


def empty_store(layers: int, batch: int, capacity: int, kv_heads: int, head_dim: int, dtype, device) -> Store:
    """A contiguous store of `capacity` positions per sequence, zeroed, every position at 0."""
    import torch

    shape = (batch, capacity, kv_heads, head_dim)
    return Store([torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                 [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)], None,
                 torch.zeros(batch, dtype=torch.long, device=device), torch.zeros(batch, dtype=torch.int32,
                                                                                  device=device))


def relaid(src: Store, page: Optional[int], seed: int) -> Store:
    """A copy of a contiguous store in another layout (shuffled pages of `page` tokens, kopt.workload.page_cache's),
    positions included: made once before a run, so each run decodes from the same prefill in its own cache."""
    from kopt.workload import page_cache

    ks, vs, table = [], [], None
    for layer in range(len(src.k)):
        k, v = src.contiguous(layer)
        if page:
            k, v, table = page_cache(k, v, page, seed, k.device)
        else:
            k, v = k.clone(), v.clone()
        ks.append(k)
        vs.append(v)
    return Store(ks, vs, table, src.pos.clone(), src.seqlens.clone())


@dataclass
class Active:
    """What the registered attention does now: the store it writes and reads, and the decode function."""

    store: Optional[Store] = None
    decode: Optional[Callable] = None     # (q [B,1,Hq,D], k, v, seqlens, block_table, scale) -> [B,1,Hq,D]
    prefill: bool = False
    who: str = "candidate"
    """Whose decode function runs: candidate, baseline or reference (named in a failure)."""
    step: int = 0
    calls: int = 0
    sdpa: Optional[Callable] = None
    errors: list = field(default_factory=list)


ACTIVE = Active()


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention interface: query [B, Hq, T, D], key / value [B, Hkv, T, D] of this step's tokens
    (rotary applied); returns ([B, T, Hq, D], None)."""
    a, layer = ACTIVE, module.layer_idx
    if a.prefill:
        a.store.write(layer, key, value, start=0)
        return a.sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=0.0, **kwargs)
    a.store.write(layer, key, value)
    q = query.transpose(1, 2).contiguous()                             # [B, 1, Hq, D]
    s = a.store
    a.calls += 1
    try:
        out = a.decode(q, s.k[layer], s.v[layer], s.seqlens, s.block_table, scaling)
    except CandidateFailure:
        raise
    except Exception as e:
        raise CandidateFailure(f"decode step {a.step}, layer {layer}: {_whose(a.who)} raised {one_line(e)}",
                               a.who) from None
    _check_out(out, q, a.step, layer, a.who)
    return out, None


def _whose(who: str) -> str:
    return "run" if who == "candidate" else f"the {who}"


def one_line(e: BaseException) -> str:
    """`Type: first line of the message` of an exception."""
    text = str(e).splitlines()[0][:200] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}".rstrip(": ")


def _check_out(out, q, step: int, layer: int, who: str) -> None:
    import torch

    where = f"decode step {step}, layer {layer}: {_whose(who)} returned"
    if not isinstance(out, torch.Tensor):
        raise CandidateFailure(f"{where} {type(out).__name__}, not a tensor", who)
    if tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or out.device != q.device:
        raise CandidateFailure(f"{where} {tuple(out.shape)} {out.dtype} on {out.device}; the model needs "
                               f"{tuple(q.shape)} {q.dtype} on {q.device}", who)


def fp32_attention(q, k, v, seqlens, block_table, scale):
    """Decode attention in fp32 over each sequence's valid keys (the reference run's; gathers pages)."""
    import torch

    from kopt.workload import Workload

    k, v = Workload(q, k, v, seqlens, block_table, 1.0, 0).logical_kv()
    b, _, hq, d = q.shape
    hkv, s = k.shape[2], k.shape[1]
    qf = q.float().view(b, hkv, hq // hkv, d)                           # [B, Hkv, G, D]
    kf, vf = k.float().permute(0, 2, 3, 1), v.float().permute(0, 2, 1, 3)  # [B, Hkv, D, S], [B, Hkv, S, D]
    sc = torch.matmul(qf, kf) * (scale if scale is not None else d ** -0.5)
    valid = torch.arange(s, device=k.device).view(1, 1, 1, s) < seqlens.view(b, 1, 1, 1)
    p = torch.softmax(sc.masked_fill(~valid, float("-inf")), dim=-1)
    return torch.matmul(p, vf).reshape(b, 1, hq, d).to(q.dtype)


def no_attention(q, k, v, seqlens, block_table, scale):
    """The step without its decode attention (q returned as the output): the rest of the step's cost."""
    return q
