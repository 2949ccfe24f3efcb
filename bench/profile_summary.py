"""Where a turn's worker CPU goes, from py-spy's raw output (`-f raw`: one line
per distinct stack, frames from the outermost to the innermost separated by
`;`, then the sample count).

Sampled with `--gil` (only the thread holding the GIL), so samples
approximate the Python CPU time of the process; the Temporal SDK's Rust core runs outside Python and
is not in them (the process's CPU seconds in the bench table include it)."""

from __future__ import annotations

import re
from collections import Counter

FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]*)(?::\d+)?\)$")
OURS = ("turnstile/", "activities/", "workflows/", "worker.py")


def _split(frame: str) -> tuple[str, str]:
    m = FRAME.match(frame.strip())
    return (m["func"], m["file"]) if m else (frame.strip(), "")


def package(path: str) -> str:
    """py-spy names files relative to their sys.path entry: the first part is
    the package (`temporalio/worker/_workflow.py` -> temporalio)."""
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    path = path.lstrip("/")
    return path.split("/", 1)[0].removesuffix(".py") or "?"


def _ours(path: str) -> str | None:
    return path if path.startswith(OURS) else None


def summarize(raw: str, turns: int, rate: int = 200, top: int = 15) -> str:
    by_leaf: Counter[str] = Counter()
    by_package: Counter[str] = Counter()
    by_ours: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_split(f) for f in stack.split(";")]
        func, path = frames[-1]
        by_leaf[f"{func} ({package(path)})"] += n
        by_package[package(path)] += n
        seen = set()
        for func, path in frames:
            ours = _ours(path)
            if ours and (key := f"{func} ({ours})") not in seen:
                seen.add(key)
                by_ours[key] += n

    def ms(n: int) -> str:
        return f"{1000 * n / rate / turns:7.2f} ms/turn {100 * n / max(total, 1):5.1f}%"

    out = [f"py-spy: {total} samples at {rate}/s over {turns} turns = "
           f"{total / rate / turns * 1000:.1f} ms of Python CPU per turn",
           "", "self time by package (innermost frame):"]
    out += [f"  {ms(n)}  {name}" for name, n in by_package.most_common(top)]
    out += ["", "self time by function (innermost frame):"]
    out += [f"  {ms(n)}  {name}" for name, n in by_leaf.most_common(top)]
    out += ["", "inclusive time of Turnstile's own functions (worker, activities, workflows):"]
    out += [f"  {ms(n)}  {name}" for name, n in by_ours.most_common(top)]
    return "\n".join(out)
