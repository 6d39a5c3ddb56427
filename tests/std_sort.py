"""A reference for the order torch's CPU argsort(descending=True) leaves ties in:
libstdc++'s std::sort (introsort), written out in Python from the algorithm (depth
limit 2 floor(log2 n), median-of-three pivot moved to the front, unguarded Hoare
partition, recursion on the right part, blocks of at most 16 left to one final
insertion sort). Checked in tests/test_mib_conventions.py against torch 2.13 itself;
if torch changes its CPU sort those checks fail and the tie-order documentation
(docs/papers/paper-c.md, gim/graph.py top_edges) must be revisited."""

import math


def introsort_descending(keys):
    """Indices of ``keys`` in the order libstdc++'s std::sort leaves (value, index)
    pairs under a by-value 'greater' comparison: introsort (median-of-three quicksort
    down to blocks of 16, then one insertion sort)."""
    v = [(float(k), i) for i, k in enumerate(keys)]

    def comp(a, b):
        return a[0] > b[0]

    def swap(i, j):
        v[i], v[j] = v[j], v[i]

    def median_to_first(result, a, b, c):
        if comp(v[a], v[b]):
            if comp(v[b], v[c]):
                swap(result, b)
            elif comp(v[a], v[c]):
                swap(result, c)
            else:
                swap(result, a)
        elif comp(v[a], v[c]):
            swap(result, a)
        elif comp(v[b], v[c]):
            swap(result, c)
        else:
            swap(result, b)

    def partition(first, last, pivot):
        while True:
            while comp(v[first], v[pivot]):
                first += 1
            last -= 1
            while comp(v[pivot], v[last]):
                last -= 1
            if not first < last:
                return first
            swap(first, last)
            first += 1

    def loop(first, last, depth):
        while last - first > 16:
            if depth == 0:
                raise NotImplementedError("heap-sort fallback")
            depth -= 1
            mid = first + (last - first) // 2
            median_to_first(first, first + 1, mid, last - 1)
            cut = partition(first + 1, last, first)
            loop(cut, last, depth)
            last = cut

    def linear_insert(last):
        val, nxt = v[last], last - 1
        while comp(val, v[nxt]):
            v[last] = v[nxt]
            last, nxt = nxt, nxt - 1
        v[last] = val

    def insertion(first, last):
        for i in range(first + 1, last):
            if comp(v[i], v[first]):
                val = v[i]
                v[first + 1 : i + 1] = v[first:i]
                v[first] = val
            else:
                linear_insert(i)

    n = len(v)
    if n > 1:
        loop(0, n, 2 * int(math.log2(n)))
        if n > 16:
            insertion(0, 16)
            for i in range(16, n):
                linear_insert(i)
        else:
            insertion(0, n)
    return [i for _, i in v]
