"""The timing both scripts share: µs a call of `fn`, best and median of five rounds of n calls."""
import statistics
import time


def best(fn, n):
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return min(rounds), statistics.median(rounds)
