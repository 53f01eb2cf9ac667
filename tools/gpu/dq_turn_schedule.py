#!/usr/bin/env python3
"""A wave model of the accumulate-dq attention backward's schedule (kernels/attention/dq_turns.cuh): how
busy the SMs are when the key tiles of a query tile take dQ turns, for a ticket order and a turn order.

  dq_turn_schedule.py [--T 1024] [--heads 12] [--sms 132] [--share 0.2] [--batches 4,8,16,32]

Model: one block per SM (the wgmma kernel's occupancy); a block is one key tile of one head
(block_n = 128 keys) and walks its query tiles (block_m = 64 queries) from the diagonal to the end, one
time unit each; the last `share` of a unit is the dQ share, which waits until the key tile before it in
turn order has added its share to that query tile. Blocks start in ticket order on the first SM that is
free. It leaves out memory traffic (the orders differ in L2 reuse: a head's key tiles together keep its
Q, dO and dq_acc rows in L2) and the wgmma kernel's tile-to-tile overlap: it is for comparing orders,
not for predicting times. What it said on 2026-11-26 (T = 1024, 12 heads, 132 SMs, share 0.2), SMs
busy: lowest key tile first with a head's key tiles together (the kernels until then) 51-55%; highest
first, the same ticket order (dq_turns.cuh since) 73% at B = 4, 85% at 8, 92% at 16, 95% at 32. The
rest is the tail: a head's longest key tile comes last.
Standard library only."""
import argparse
import heapq


def busy(batches, T, heads, sms, share, highest_first, block_m=64, block_n=128):
    n_kv, n_q = -(-T // block_n), -(-T // block_m)
    key_order = list(range(n_kv))[::-1] if highest_first else list(range(n_kv))
    tickets = [(g, kt) for g in range(batches * heads) for kt in key_order]  # a head's key tiles together
    done = {}  # (head, key tile) -> {query tile: time its dQ share was added}
    free = [0.0] * sms
    work = end = 0.0
    for g, kt in tickets:
        t = heapq.heappop(free)
        first_q = kt * block_n // block_m
        before = (g, kt + 1) if highest_first else (g, kt - 1)  # whose turn comes just before this one
        added = {}
        for q in range(first_q, n_q):
            waits = done.get(before, {}).get(q, 0.0)
            t = max(t + (1.0 - share), waits) + share
            added[q] = t
        done[(g, kt)] = added
        work += n_q - first_q
        end = max(end, t)
        heapq.heappush(free, t)
    return work / (end * sms)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--share", type=float, default=0.2, help="the dQ share's part of a query tile's time")
    ap.add_argument("--batches", default="4,8,16,32")
    a = ap.parse_args()
    print(f"T={a.T} heads={a.heads} SMs={a.sms} dQ share {a.share:.2f} of a tile: SMs busy")
    for b in (int(x) for x in a.batches.split(",")):
        low = busy(b, a.T, a.heads, a.sms, a.share, highest_first=False)
        high = busy(b, a.T, a.heads, a.sms, a.share, highest_first=True)
        print(f"  B={b:3d}: lowest key tile first {100 * low:5.1f}%   highest first {100 * high:5.1f}%")


if __name__ == "__main__":
    main()
