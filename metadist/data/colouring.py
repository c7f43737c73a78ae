"""Which rank gets which task of a round: an equitable edge colouring.

A dealt stretch of an epoch's order is cut into rounds of `world_size` consecutive tasks;
every rank gets one task of every round, and within each stratum every run of
`world_size` consecutive tasks of that stratum (a *block*) goes to distinct ranks, so each
rank gets ⌊n_s / W⌋ or ⌈n_s / W⌉ of the n_s tasks of stratum s (an equitable edge
colouring of the rounds × stratum-blocks bipartite multigraph, de Werra 1971).
"""

from __future__ import annotations

import numpy as np


def equitable_colouring(strata: np.ndarray, world_size: int) -> np.ndarray:
    """Ranks (colours) for a sequence cut into rounds of `world_size` consecutive items.

    Every round gets each colour once; within each stratum, every run of `world_size`
    consecutive items of that stratum (a block) gets distinct colours. That is a proper
    edge colouring with `world_size` colours of the bipartite multigraph rounds × blocks,
    whose degrees are at most `world_size`, so one exists (König); it is built greedily
    and repaired with alternating (Kempe) paths where the greedy choice is blocked.

    Args:
        strata: `[R * W]` stratum code of each item in order.
        world_size: W.

    Returns:
        `[R * W]` int64 colours in 0..W-1.
    """
    num_items = len(strata)
    w = world_size
    if w == 1 or num_items == 0:
        return np.zeros(num_items, dtype=np.int64)
    by_stratum = np.argsort(strata, kind="stable")
    _, first, counts = np.unique(strata[by_stratum], return_index=True, return_counts=True)
    index_in_stratum = np.empty(num_items, dtype=np.int64)
    index_in_stratum[by_stratum] = np.arange(num_items) - np.repeat(first, counts)
    blocks_per_stratum = -(-counts // w)
    block_base = np.concatenate(([0], np.cumsum(blocks_per_stratum)[:-1]))
    stratum_slot = np.empty(num_items, dtype=np.int64)
    stratum_slot[by_stratum] = np.repeat(np.arange(len(counts)), counts)
    block = (block_base[stratum_slot] + index_in_stratum // w).tolist()
    num_rounds = num_items // w
    num_blocks = int(blocks_per_stratum.sum())
    # at_round[u][c] / at_block[v][c]: the item of colour c at that node, or -1.
    at_round = [[-1] * w for _ in range(num_rounds)]
    at_block = [[-1] * w for _ in range(num_blocks)]
    colour = [-1] * num_items
    item_round = [i // w for i in range(num_items)]
    for item in range(num_items):
        u, v = item_round[item], block[item]
        ru, bv = at_round[u], at_block[v]
        # The first colour free at both ends if there is one; otherwise swap the two
        # colours along an alternating path so that one becomes free at both.
        chosen = -1
        for c in range(w):
            if ru[c] < 0 and bv[c] < 0:
                chosen = c
                break
        if chosen < 0:
            a = ru.index(-1)  # free at the round, used at the block
            b = bv.index(-1)  # free at the block, used at the round
            path = []
            node_is_block, node, want = True, v, a
            while True:
                table = at_block if node_is_block else at_round
                nxt = table[node][want]
                if nxt < 0:
                    break
                path.append(nxt)
                node = item_round[nxt] if node_is_block else block[nxt]
                node_is_block = not node_is_block
                want = b if want == a else a
            for e in path:
                at_round[item_round[e]][colour[e]] = -1
                at_block[block[e]][colour[e]] = -1
            for e in path:
                colour[e] = b if colour[e] == a else a
                at_round[item_round[e]][colour[e]] = e
                at_block[block[e]][colour[e]] = e
            chosen = a
        colour[item] = chosen
        ru[chosen] = item
        bv[chosen] = item
    return np.asarray(colour, dtype=np.int64)
