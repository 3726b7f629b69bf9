"""What failed items mean for a run, for download and extract alike.

`should_retry`, the one table of what ``--retry-failed`` re-attempts: transient failures
(timeouts, resets, DNS, 429/5xx) always; a refusal by an option (a private address, too
large, an image filter) only when that option changed so that the refusal may no longer
apply — judged against the options the failure happened under, which every shard's stats
record (`pipeline.download.shard.policy_of`); "internal error" and "extract error" always (a bug may be fixed, a
device may have had no memory); anything else (http 404, opted out, not an image, ...)
never.

`verdict`: a run fails (exit 1) when shards failed for good, when every item failed, or
when the failure rate of all items of the output folder, earlier runs included, exceeds
``--max-failure-rate`` (`pipeline.distribute.summary` puts it in every run summary).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

Policy = dict  # the option values refusals depend on (JSON-able): `pipeline.download.shard.policy_of`


@dataclass(frozen=True)
class RetryRule:
    when: Callable[[Policy, Policy], bool]  # (options the failure happened under, options now) -> re-attempt?
    hint: str  # what to change, for messages


def _more_networks(old: Policy, new: Policy) -> bool:
    return (new["allow_private_network"] and not old["allow_private_network"]) or not (
        set(new["allowed_networks"]) <= set(old["allowed_networks"])
    )


def _raised(name: str, off: Optional[float] = None) -> Callable[[Policy, Policy], bool]:
    """The limit `name` is larger now (or switched off, where the value `off` means off)."""
    if off is None:
        return lambda old, new: new[name] > old[name]
    return lambda old, new: old[name] != off and (new[name] == off or new[name] > old[name])


def _always(old: Policy, new: Policy) -> bool:
    return True


RETRY_WHEN: dict[str, RetryRule] = {
    "private address": RetryRule(_more_networks, "--allow-private-network or --allow-network CIDR"),
    "too large": RetryRule(_raised("max_bytes"), "a larger --max-bytes"),
    "too many redirects": RetryRule(_raised("max_redirects"), "a larger --max-redirects"),
    "decompression bomb": RetryRule(_raised("max_pixels"), "a larger --max-pixels"),
    "too small": RetryRule(lambda old, new: new["min_side"] < old["min_side"], "a smaller --min-side"),
    "aspect ratio": RetryRule(_raised("max_aspect_ratio", off=0), "a larger --max-aspect-ratio (0: off)"),
    "internal error": RetryRule(_always, "a fixed vlprep (please report it)"),
    "extract error": RetryRule(_always, "more device memory, or a smaller --batch-size"),
}


def should_retry(kind: str, transient: bool, old: Optional[Policy], new: Policy) -> bool:
    """Whether --retry-failed re-attempts a failure of `kind` that happened under the
    options `old` (None: not recorded, by an older version) when the options are now `new`."""
    if transient:
        return True
    rule = RETRY_WHEN.get(kind)
    return rule is not None and (old is None or rule.when(old, new))


def verdict(
    items: int, successes: int, failures: Counter, shards_failed: dict, max_rate: float, malformed: int = 0
) -> dict:
    """The summary fields that judge a run: failure_rate, max_failure_rate, verdict ("ok"
    or "failed") and verdict_reason (one line naming the top reasons and how to retry). A
    folder with no items at all (an empty input, or every row malformed) has failed."""
    rate = (items - successes) / items if items else 0.0
    reason = None
    if not items and not shards_failed:
        reason = (
            f"no items: all {malformed:,} input rows are malformed (see malformed_examples in the summary; "
            "a wrong column name?)"
            if malformed
            else "no items: the input lists none"
        )
    elif shards_failed:
        reason = (
            f"{len(shards_failed)} shard(s) failed for good ({', '.join(sorted(shards_failed)[:5])}; see "
            "shards_failed in the summary); rerun the same command to retry them"
        )
    elif items and (successes == 0 or rate > max_rate):
        top = failures.most_common(3)
        hints = [f"{kind}: {RETRY_WHEN[kind].hint}" for kind, _ in top if kind in RETRY_WHEN]
        reason = (
            f"{items - successes:,} of {items:,} items failed ({rate:.1%}; --max-failure-rate {max_rate:g}): "
            + ", ".join(f"{kind} x {count:,}" for kind, count in top)
            + ". Finished work is kept; rerun with --retry-failed to re-attempt transient failures"
            + (f" and those the changed options now allow ({'; '.join(hints)})" if hints else "")
        )
    return {
        "failure_rate": round(rate, 4),
        "max_failure_rate": max_rate,
        "verdict": "failed" if reason else "ok",
        "verdict_reason": reason,
    }
