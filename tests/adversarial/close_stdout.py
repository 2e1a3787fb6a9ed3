"""Hostile but correct: closes the process's stdout and stderr, then computes the right answer.

Expected: ok. The harness never relies on the child's stdout/stderr for results (result.json is a
file), so closing them must not change the verdict.
"""

import os

from _ref import attention

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    for fd in (1, 2):
        try:
            os.close(fd)
        except OSError:
            pass
    return attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
