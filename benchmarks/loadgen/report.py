"""Same-run comparison tables: medians over runs, percentiles, and ratios that read the same
way in every row (>= 1.00: this broker is as good as RabbitMQ or better)."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

LEGEND = ("ratio >= 1.00 means exchange-broker is as good as RabbitMQ or better: "
          "ours / RabbitMQ for rates, RabbitMQ / ours for latency, memory and CPU")


@dataclass(frozen=True)
class Metric:
    key: str                   # field of a tool's JSON result
    label: str                 # what the table calls it
    higher_is_better: bool = True
    fmt: str = ",.0f"          # format of the value
    ratio: bool = True         # False: shown for information, no ratio


def percentile(sorted_values, p: float) -> float | None:
    """Nearest-rank percentile of an already sorted sequence (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def latency_summary(prefix: str, values_ns: list[int]) -> dict:
    """{prefix_p50_ms, prefix_p99_ms, prefix_max_ms, prefix_samples} from nanosecond samples."""
    vals = sorted(values_ns)
    out = {f"{prefix}_samples": len(vals)}
    for name, p in (("p50", 50), ("p99", 99), ("max", 100)):
        v = percentile(vals, p)
        out[f"{prefix}_{name}_ms"] = None if v is None else round(v / 1e6, 3)
    return out


def median_result(results: list[dict]) -> dict:
    """One result from several runs of the same thing: every numeric field is the median over
    the runs without an error; the rest comes from the first such run. ``runs`` keeps them all."""
    ok = [r for r in results if "error" not in r]
    if not ok:
        return dict(results[-1]) if results else {"error": "no run"}
    med = dict(ok[0])
    for key, value in ok[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            vals = [r[key] for r in ok if isinstance(r.get(key), (int, float))]
            if vals:
                med[key] = statistics.median(vals)
    if len(results) > 1:
        med["runs"] = results
    return med


def ratio(ours, rabbit, higher_is_better: bool = True) -> float | None:
    if ours is None or rabbit is None:
        return None
    if higher_is_better:
        return ours / rabbit if rabbit else None
    return rabbit / ours if ours else None


def fmt_value(value, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    try:
        return format(value, fmt)
    except (TypeError, ValueError):
        return str(value)


def rows_for(scenario: str, metrics: list[Metric], ours: dict | None,
             rabbit: dict | None) -> list[tuple[str, ...]]:
    """Table rows (scenario, metric, ours, RabbitMQ, ratio) for one scenario."""
    rows = []
    for m in metrics:
        o = _value(ours, m.key)
        r = _value(rabbit, m.key)
        rt = ratio(o, r, m.higher_is_better) if m.ratio and not isinstance(o, bool) else None
        rows.append((scenario, m.label, _cell(ours, o, m.fmt), _cell(rabbit, r, m.fmt),
                     "-" if rt is None else f"{rt:.2f}"))
    return rows


def _value(result: dict | None, key: str):
    if not result or "error" in result:
        return None
    return result.get(key)


def _cell(result: dict | None, value, fmt: str) -> str:
    if result is None:
        return "skipped"
    if "error" in result:
        return "error"
    return fmt_value(value, fmt)


def print_table(rows: list[tuple[str, ...]], ours_name: str = "exchange-broker",
                rabbit_name: str = "RabbitMQ") -> None:
    head = ("scenario", "metric", ours_name, rabbit_name, "ratio")
    allrows = [head, *rows]
    widths = [max(len(row[i]) for row in allrows) for i in range(len(head))]
    for n, row in enumerate(allrows):
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print(LEGEND)
