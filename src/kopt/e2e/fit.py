"""Fit the random decoder to one task before it decodes, so that its greedy choices are decisive.

A decoder of random weights has near-flat logits: the top two tokens are often a few hundredths apart, so any
bf16 attention (FA2's own, against fp32 attention) parts the greedy tokens within a step or two, and "the same
tokens" says nothing about a kernel. `--fit-steps N` trains the decoder (fp32 weights, the library's own SDPA,
AdamW) for N steps on sequences that repeat a random block of PERIOD tokens. Continuing such a sequence means
copying the token PERIOD - 1 positions back, which only attention over the cache can do; once the fit has learned
the copy, the decoder continues the prompt's block with a wide margin at every step, so a kernel that reads the
wrong keys, pages or heads changes the tokens, and one that reads them right keeps them. The prompt of a fitted run
repeats a block too (`prompt`). Whether the fit learned it is measured, not assumed: FIT_LOSS and COPIED on the
line, and FIT_COPY checks the copy as the run decodes (copy_accuracy). The 2-layer CPU decoder learns it in about
300 steps; TinyLlama's 22 layers at hidden 2048 in about 1000 on an H100 (sequences of 1600 tokens).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

#: Tokens of the repeated block (at most half the prompt).
PERIOD = 64
#: A fitting step trains on up to FIT_BATCH sequences and FIT_TOKENS tokens, each sequence as long as the run it
#: prepares (prompt and decoded tokens): a copy learned on shorter sequences does not carry to later positions (an
#: H100, TinyLlama's shape at 22 layers: fitted on 512 tokens to a loss of 0.004, it copied 0 of 64 tokens decoded
#: after a 1536-token prompt).
FIT_BATCH, FIT_TOKENS = 8, 8192
#: Peak learning rate (AdamW) at hidden size LR_HIDDEN, scaled by LR_HIDDEN / hidden for wider decoders: an Adam
#: step moves every weight by about the rate, so it moves a layer's output in proportion to its fan-in (the muP
#: rule for hidden matrices); warm-up steps, gradient clip.
LR, LR_HIDDEN, WARMUP, CLIP = 1e-3, 256, 20, 1.0
#: The fit stops early once its loss, averaged over the last DONE_STEPS steps, is below DONE_LOSS nats a token. At
#: 0.01 a fit stopped just past the drop, with errors left where decoding reads (an H100, 22 layers, 64 tokens
#: decoded after 1536: TinyLlama's shape at batch 8 parted from the block at step 3; 70B-TP8's shape at step 0, and
#: FA2 parted from fp32 attention at step 9): ten times lower, the copy has margin.
DONE_LOSS, DONE_STEPS = 0.001, 5
#: The block's tokens come from the first BLOCK_VOCAB ids of the vocabulary.
BLOCK_VOCAB = 512
#: The fit's loss is kept every TRACE_EVERY steps.
TRACE_EVERY = 50
#: Fitted decoders are kept in $KOPT_FIT_CACHE (default $XDG_CACHE_HOME/kopt/e2e-fits, else ~/.cache/kopt/e2e-fits;
#: 0: off), one file a fit, named by a hash of everything the fit depends on (cache_file): the runs of one shape at
#: batch 1 and 8 fit the same decoder, so the second loads it (seconds) instead of fitting again (minutes on a GPU).
ENV_CACHE = "KOPT_FIT_CACHE"


@dataclass
class Fitted:
    """How the fit went: steps taken (fewer than asked when it stopped early), the copy loss at its last step (nats
    a token, the part after the first block)."""

    steps: int
    loss_last: float
    trace: list = field(default_factory=list)
    """[step, loss] every TRACE_EVERY steps and at the last: how the fit went, kept in the e2e row."""
    cached: bool = False
    """Loaded from the fit cache (ENV_CACHE): the same fit, run before; steps, loss and trace are that fit's."""
    copy_acc: Optional[float] = None
    """copy_accuracy of the decoder as this run decodes with it (measured by every run, never kept)."""


def cache_file(parts: dict, sources: tuple = (), env: Optional[dict] = None) -> Optional[Path]:
    """The file that keeps the decoder fitted under `parts` (its sizes, seed, steps, lengths, dtype, device), or
    None with the cache off. The name hashes parts, this module's source and `sources` (the caller's: the decoder's
    construction), and the torch and transformers versions: a change to any of them fits again."""
    import torch
    import transformers

    env = os.environ if env is None else env
    folder = env.get(ENV_CACHE)
    if folder == "0":
        return None
    if not folder:
        from kopt.paths import cache_home

        folder = cache_home(env) / "e2e-fits"
    h = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
    for src in (__file__, *sources):
        h.update(Path(src).read_bytes())
    h.update(f"{torch.__version__} {transformers.__version__}".encode())
    return Path(folder) / f"{h.hexdigest()[:20]}.pt"


def load(lm, path: Optional[Path], dtype, device: str) -> Optional[Fitted]:
    """lm cast to dtype and given the fitted weights kept at path; None (lm untouched) when there are none or they
    cannot be read (a partial or foreign file: the run fits again)."""
    import torch

    if path is None or not path.is_file():
        return None
    try:
        blob = torch.load(path, map_location=device, weights_only=True)
        f = Fitted(**blob["fitted"])
        lm.to(dtype).load_state_dict(blob["state"])
    except Exception:  # noqa: BLE001  (an unreadable file is a cache miss, never a failed run)
        return None
    f.cached = True
    return f


def save(lm, fitted: Fitted, path: Optional[Path]) -> None:
    """Keep lm's (fitted, cast) weights and how the fit went at path, written whole or not at all."""
    import torch

    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    kept = {k: v for k, v in asdict(fitted).items() if k not in ("cached", "copy_acc")}
    torch.save({"fitted": kept, "state": lm.state_dict()}, tmp)
    os.replace(tmp, path)


def continuation(prompt, steps: int):
    """[steps, batch] the tokens that continue a repeated-block prompt [batch, P] after the prefill's first one:
    decode step t's token is the block's token at position P + t + 1."""
    import torch

    per = period(prompt.shape[1])
    pos = (prompt.shape[1] + 1 + torch.arange(steps, device=prompt.device)) % per
    return prompt[:, pos].T


def period(prompt_len: int) -> int:
    """The block length for a prompt: PERIOD, at most half the prompt."""
    return max(2, min(PERIOD, prompt_len // 2))


def prompt(batch: int, length: int, per: int, vocab: int, generator, device: str):
    """[batch, length] token ids: each row one random block of `per` tokens repeated (ids below BLOCK_VOCAB)."""
    import torch

    block = torch.randint(0, min(vocab, BLOCK_VOCAB), (batch, per), generator=generator)
    return block.repeat(1, -(-length // per))[:, :length].to(device)


def copy_accuracy(lm, seq_len: int, tail: int, per: int, seed: int, device: str) -> float:
    """The share of the last `tail` positions of FIT_BATCH fresh repeated-block sequences of seq_len tokens whose
    next token lm predicts right, teacher-forced, with the library's own SDPA, in lm's own dtype: where the decode
    reads and as it computes (the fit's loss is taken with fp32 weights, under bf16 autocast on a GPU). A fit whose
    loss is low but whose copy this finds wrong lost it in the cast to the run's dtype, not in an attention."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed + 3)
    with _sdpa(lm), torch.inference_mode():
        x = prompt(_batch(seq_len), seq_len + 1, per, lm.config.vocab_size, g, device)
        h = lm.model(input_ids=x[:, :-1], use_cache=False).last_hidden_state[:, -tail:]
        right = lm.lm_head(h).argmax(-1) == x[:, -tail:]
    return float(right.float().mean())


def _batch(seq_len: int) -> int:
    """Sequences of seq_len tokens a fitting step (and the copy check) takes: at most FIT_BATCH and FIT_TOKENS."""
    return max(1, min(FIT_BATCH, FIT_TOKENS // seq_len))


@contextlib.contextmanager
def _sdpa(lm):
    """lm's attention set to the library's own SDPA inside, its own restored after."""
    impl = lm.config._attn_implementation
    lm.config._attn_implementation = "sdpa"
    try:
        yield lm
    finally:
        lm.config._attn_implementation = impl


def fit(lm, steps: int, seq_len: int, per: int, seed: int, device: str) -> Fitted:
    """Train lm in place for up to `steps` steps on repeated blocks (module docstring), its attention set to SDPA
    for the fit and restored after; it stops early once the loss is below DONE_LOSS. The loss counts the positions
    after the first block (the part a copy can predict)."""
    import torch

    lm.train()
    g = torch.Generator(device="cpu").manual_seed(seed + 2)
    lr = LR * LR_HIDDEN / lm.config.hidden_size
    opt = torch.optim.AdamW(lm.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / WARMUP))
    batch, cuda = _batch(seq_len), device == "cuda"
    losses, trace = [], []
    try:
        with _sdpa(lm):
            for _ in range(steps):
                x = prompt(batch, seq_len + 1, per, lm.config.vocab_size, g, device)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
                    h = lm.model(input_ids=x[:, :-1], use_cache=False).last_hidden_state[:, per - 1:]
                    logits = lm.lm_head(h).float()
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, per:].flatten())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(lm.parameters(), CLIP)
                opt.step()
                sched.step()
                losses.append(float(loss.detach()))
                if len(losses) % TRACE_EVERY == 0:
                    trace.append([len(losses), round(losses[-1], 4)])
                if len(losses) >= DONE_STEPS and sum(losses[-DONE_STEPS:]) < DONE_LOSS * DONE_STEPS:
                    break
    finally:
        lm.eval()
        opt.zero_grad(set_to_none=True)
        del opt
    if losses and (not trace or trace[-1][0] != len(losses)):
        trace.append([len(losses), round(losses[-1], 4)])
    return Fitted(len(losses), losses[-1] if losses else float("nan"), trace)
