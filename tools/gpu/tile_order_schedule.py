#!/usr/bin/env python3
"""A wave model of the mma.sync attention kernels' block order (kernels/attention/tile_order.hpp): how busy
the SMs are when the blocks start head after head, and in rank order across groups of heads.

  tile_order_schedule.py [--T 1024] [--hs 64] [--heads 12] [--slots 264] [--batches 4,8,16,32,64]

Model: `slots` blocks run at once (the kernels' __launch_bounds__(128, 2): two a SM, 132 SMs); a block
starts on the first free slot, in launch order, and runs for its tile's work: forward query tile qt (128
rows) qt + 1 key tiles; backward key tile kt (64 keys) 4 products over n - kt query tiles, query tile qt
3 products over qt + 1 key tiles. It leaves out memory (why the groups hold at most 40 MiB of inputs:
tile_order.hpp) and the diagonal tiles' smaller work: it compares orders, it does not predict times.
Orders: "head after head" (the kernels until 2026-11-27: a head's tiles heaviest first, then the next
head's; the backward's key tiles, then its query tiles), "groups" (the default since: ranks across groups
of heads, as many as tile_groups says, their sizes differing by at most one), "one group" (ranks across
every head).
What it said on 2026-11-27 (T = 1024, hs = 64, 12 heads), SMs busy at B = 4 / 8 / 16 / 32 / 64:
  forward   head after head 55 / 73 / 85 / 92 / 95%, groups 82 / 82 / 94 / 97 / 99%, one group 82 / 94 / 97 / 99 / 100%
  backward  head after head 81 / 90 / 95 / 97 / 98%, groups 97 / 99 / 99 / 100 / 100%
The H100 ran the forward at 0.75 of its B = 64 rate at B = 8 and the backward at 0.92 (docs/performance.md);
head after head gives 0.76 and 0.91. One group is better still for the forward in this model, but from B = 16
on its inputs outgrow L2 (the rows AttentionTileOrder/.../all_heads measure what that costs). The H200 (2026-11-27)
ran one group over B = 8's heads 1.10x faster than three (forward) and over B = 64's within 1-2% of 19: the
forward's groups now hold 40 MiB (B = 8: one group), the backward runs one group, and the figures above
are for 16 MiB.
Standard library only.
"""
import argparse
import heapq

GROUP_BYTES = 40 << 20  # tile_order.hpp kTileGroupBytes


def busy(costs, slots):
    """Share of slot time spent working when blocks of these costs start in this order."""
    free = [0.0] * slots
    end = work = 0.0
    for c in costs:
        t = heapq.heappop(free) + c
        work += c
        end = max(end, t)
        heapq.heappush(free, t)
    return work / (end * slots)


def groups_for(heads, head_bytes):
    """tile_order.hpp tile_groups (no forced size; head_bytes 0: one group)."""
    cap = min(heads, max(1, GROUP_BYTES // head_bytes)) if head_bytes > 0 else heads
    return -(-heads // cap)


def ranked(heads, per_rank, groups):
    """Launch order of tile_slot: groups of heads (the first heads % groups one head larger), each rank's
    roles over the group's heads."""
    order = []
    for g in range(groups):
        here = heads // groups + (1 if g < heads % groups else 0)
        for costs in per_rank:
            for c in costs:
                order += [c] * here
    return order


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--hs", type=int, default=64)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--slots", type=int, default=264)
    ap.add_argument("--batches", default="4,8,16,32,64")
    a = ap.parse_args()
    n_fwd, n_bwd = -(-a.T // 128), -(-a.T // 64)
    fwd = [[n_fwd - r] for r in range(n_fwd)]  # rank r: query tile n - 1 - r
    bwd = [[4 * (n_bwd - r), 3 * (n_bwd - r)] for r in range(n_bwd)]  # key tile r, query tile n - 1 - r
    fwd_head = [c for (c,) in fwd]
    bwd_head = [4 * (n_bwd - kt) for kt in range(n_bwd)] + [3 * (n_bwd - r) for r in range(n_bwd)]
    print(f"T={a.T} hs={a.hs} heads={a.heads} slots={a.slots}: SMs busy (head after head / groups / one group)")
    for b in (int(x) for x in a.batches.split(",")):
        heads = b * a.heads
        # attention.cu: the forward's groups bound by L2 (q, k, v a head), the backward in one group
        for name, per_rank, per_head, inputs in (("forward ", fwd, fwd_head, 3), ("backward", bwd, bwd_head, 0)):
            g = groups_for(heads, inputs * a.T * a.hs * 2)
            print(f"  B={b:3d} {name} {100 * busy(per_head * heads, a.slots):5.1f}%  "
                  f"{100 * busy(ranked(heads, per_rank, g), a.slots):5.1f}% ({g} groups)  "
                  f"{100 * busy(ranked(heads, per_rank, 1), a.slots):5.1f}%")


if __name__ == "__main__":
    main()
