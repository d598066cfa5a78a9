"""Synthetic verifiable tasks (SWE-smith style), their oracle trajectories, and fast-apply examples.

Vocabulary used throughout:

    project    a small Python package made from a template with random names and constants:
               a module, a helper module that calls it, and a unittest file whose expected
               values were computed by running the module itself
    task       an instruction, the workspace files before, the reference solution (the files
               that change, with their new text) and the verifying command; a task is kept only
               if its verifying command FAILS on the workspace and PASSES on the solution, both
               checked by running it in a subprocess at generation time
    family     how a task was made: `edit/rename`, `edit/constant`, `edit/add_parameter`,
               `edit/add_import`, `edit/remove_function` (instruction-explicit edits; the tests
               describe the target) or `bugfix/operator_swap`, `bugfix/off_by_one`,
               `bugfix/comparison`, `bugfix/swapped_arguments` (working code mutated; the tests
               are the original, passing ones)
    oracle     writes a correct trajectory for a task in the harness's chat format (OpenAI-shaped
               messages: assistant `tool_calls`, tool results as role "tool"), running every
               tool call for real on a scratch copy of the workspace; its choices (explore first
               or not, search or read, ranges, one edit or several, which phrasing) are drawn
               at random so the model does not learn one script
    fast-apply an original file plus an edit sketch (changed lines with `... existing code ...`
               markers) -> the whole updated file: what the engine's apply path serves with the
               original file as its n-gram speculation

The held-out split is by project (hash of template and seed), so held-out tasks come from
projects the training split never saw.

Trajectories are what the harness sees at run time: its system prompt, tool schemas and
repository map (agent/harness/prompts.py, context.py), and tool results from its own tools
(`run_tool` on a real `Workspace` over a scratch copy; see `HarnessScratch`). The fast-apply
prompt is agent/chat_format.py's `apply_messages`, the one the engine's apply path uses.

What it does not do: languages other than Python, multi-package repositories, tasks needing the
network.

    flywheel train tasks --out runs/starter/tasks --projects 200
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agent.chat_format import apply_messages

TEST_COMMAND = "python -m unittest"
TEST_TIMEOUT_S = 20.0

# --- projects --------------------------------------------------------------------------------

# Name pools. They are wide on purpose: with a handful of module names a small model learns
# them by heart and writes `budget.py` whatever the prompt says; with hundreds, the only way to
# get a name right is to copy it from the instruction or a tool result.
_NOUNS = [
    "price",
    "order",
    "item",
    "score",
    "reading",
    "sample",
    "packet",
    "record",
    "entry",
    "ticket",
    "invoice",
    "metric",
    "task",
    "batch",
    "token",
    "frame",
    "cell",
    "point",
    "parcel",
    "shipment",
    "fare",
    "quote",
    "bid",
    "payment",
    "refund",
    "voucher",
    "coupon",
    "credit",
    "debit",
    "grade",
    "mark",
    "vote",
    "rating",
    "review",
    "visit",
    "booking",
    "seat",
    "slot",
    "shift",
    "lap",
    "split",
    "stage",
    "step",
    "tick",
    "pulse",
    "signal",
    "event",
    "alert",
    "report",
    "row",
    "column",
    "chunk",
    "block",
    "page",
    "line",
    "word",
]
_VERBS = [
    "compute",
    "calc",
    "get",
    "find",
    "make",
    "count",
    "measure",
    "collect",
    "sum",
    "build",
    "fetch",
    "load",
    "derive",
    "tally",
    "gather",
    "resolve",
    "estimate",
    "score",
    "rank",
    "check",
    "pick",
    "total",
    "average",
    "merge",
]
_MODULE_WORDS = [
    "pricing",
    "ledger",
    "stats",
    "scoring",
    "inventory",
    "billing",
    "metrics",
    "grading",
    "shipping",
    "payroll",
    "sensors",
    "tally",
    "budget",
    "orders",
    "timesheet",
    "rates",
    "tickets",
    "invoices",
    "refunds",
    "vouchers",
    "coupons",
    "credits",
    "fares",
    "quotes",
    "bids",
    "bookings",
    "seats",
    "visits",
    "reviews",
    "ratings",
    "votes",
    "marks",
    "grades",
    "shifts",
    "laps",
    "splits",
    "stages",
    "signals",
    "alerts",
    "reports",
    "rows",
    "columns",
    "chunks",
    "blocks",
    "pages",
    "parcels",
    "shipments",
    "payments",
    "readings",
    "samples",
    "packets",
    "records",
    "entries",
    "tokens",
    "frames",
    "cells",
    "points",
    "totals",
    "taxes",
    "fees",
    "discounts",
    "balances",
    "wallets",
    "accounts",
    "meters",
    "buckets",
    "queues",
    "stocks",
    "counters",
    "registers",
]
_MODULE_SUFFIXES = ["", "", "", "_core", "_utils", "_calc", "_lib", "_ops", "_math"]
_MODULES = sorted({w + s for w in _MODULE_WORDS for s in _MODULE_SUFFIXES})
_HELPERS = [
    f"{word}{suffix}"
    for word in ["report", "service", "app", "views", "jobs", "tasks", "cli", "main", "api"]
    for suffix in ["", "_app", "s_v2", "_runner"]
]
_CLASSES = [
    "Account",
    "Wallet",
    "Counter",
    "Register",
    "Meter",
    "Bucket",
    "Queue",
    "Stock",
    "Ledger",
    "Purse",
    "Tab",
    "Till",
    "Vault",
    "Tracker",
    "Gauge",
    "Tank",
    "Reservoir",
    "Budget",
    "Fund",
    "Pot",
    "Kitty",
    "Bank",
    "Safe",
    "Store",
    "Cache",
]


@dataclass
class Project:
    """A working project: every test passes. Names are the template's symbols, randomised."""

    key: str  # template:seed, decides the split
    module: str  # module file name without .py
    helper: str  # helper module file name without .py
    names: dict[str, str]  # role -> chosen symbol name
    constants: dict[str, object]  # constant name -> value
    numeric_functions: list[str]  # functions returning numbers (for add_parameter)
    source: str  # the module's text
    helper_source: str  # the helper module's text
    calls: list[str]  # expressions the tests check, in terms of `mod.` and `helper.`


def _fresh(rng: random.Random, pool: list[str], used: set[str]) -> str:
    for _ in range(100):
        name = rng.choice(pool)
        if name not in used:
            used.add(name)
            return name
    name = f"{rng.choice(pool)}_{len(used)}"
    used.add(name)
    return name


def _fn(rng: random.Random, used: set[str], noun: str | None = None) -> str:
    return _fresh(rng, [f"{v}_{noun or n}" for v in _VERBS for n in _NOUNS], used)


def _template_totals(rng: random.Random, used: set[str]) -> tuple[dict, dict, str, str, list[str]]:
    n = {
        "total": _fn(rng, used, "total"),
        "tax": _fn(rng, used, "with_tax"),
        "discount": _fn(rng, used, "discount"),
        "legacy": "legacy_" + _fn(rng, used),
    }
    c = {
        "TAX_RATE": rng.choice([0.05, 0.1, 0.2, 0.25]),
        "BULK_THRESHOLD": rng.randint(3, 9),
        "DISCOUNT_PERCENT": rng.choice([5, 10, 15, 20]),
    }
    src = f'''"""Totals, tax and bulk discounts."""

TAX_RATE = {c["TAX_RATE"]}
BULK_THRESHOLD = {c["BULK_THRESHOLD"]}
DISCOUNT_PERCENT = {c["DISCOUNT_PERCENT"]}


def {n["total"]}(prices):
    result = 0
    for price in prices:
        result = result + price
    return result


def {n["tax"]}(amount):
    return round(amount * (1 + TAX_RATE), 2)


def {n["discount"]}(amount, count):
    if count >= BULK_THRESHOLD:
        return amount - amount * DISCOUNT_PERCENT / 100
    return amount


def {n["legacy"]}(prices):
    return sum(prices) * 1.0
'''
    helper = f"""from {{module}} import {n["discount"]}, {n["tax"]}, {n["total"]}


def invoice(prices):
    subtotal = {n["total"]}(prices)
    return {n["tax"]}({n["discount"]}(subtotal, len(prices)))
"""
    t = c["BULK_THRESHOLD"]
    calls = [
        f"mod.{n['total']}([1, 2, 3])",
        f"mod.{n['total']}([])",
        f"mod.{n['tax']}(100)",
        f"mod.{n['tax']}(19.99)",
        f"mod.{n['discount']}(200, {t})",
        f"mod.{n['discount']}(200, {t - 1})",
        f"mod.{n['discount']}(50, {t + 2})",
        f"helper.invoice([10] * {t})",
        "helper.invoice([4, 5])",
    ]
    return n, c, src, helper, calls


def _template_ranges(rng: random.Random, used: set[str]) -> tuple[dict, dict, str, str, list[str]]:
    n = {
        "chunk": _fn(rng, used, "chunks"),
        "window": _fn(rng, used, "window_sums"),
        "clamp": _fn(rng, used, "clamped"),
        "legacy": "legacy_" + _fn(rng, used),
    }
    c = {
        "DEFAULT_SIZE": rng.randint(2, 4),
        "LOWER": rng.randint(0, 5),
        "UPPER": rng.randint(20, 90),
    }
    src = f'''"""Chunks, sliding windows and clamping of number lists."""

DEFAULT_SIZE = {c["DEFAULT_SIZE"]}
LOWER = {c["LOWER"]}
UPPER = {c["UPPER"]}


def {n["chunk"]}(items, size=DEFAULT_SIZE):
    return [items[i : i + size] for i in range(0, len(items), size)]


def {n["window"]}(values, width):
    if width > len(values):
        return []
    return [sum(values[i : i + width]) for i in range(len(values) - width + 1)]


def {n["clamp"]}(value, low=LOWER, high=UPPER):
    if value < low:
        return low
    if value > high:
        return high
    return value


def {n["legacy"]}(items):
    return list(reversed(items))
'''
    helper = f"""from {{module}} import {n["chunk"]}, {n["clamp"]}, {n["window"]}


def smoothed(values, width):
    return [{n["clamp"]}(total - width) for total in {n["window"]}(values, width)]


def pages(items, per_page):
    return len({n["chunk"]}(items, per_page))
"""
    calls = [
        f"mod.{n['chunk']}(list(range(7)))",
        f"mod.{n['chunk']}([1, 2, 3, 4], 3)",
        f"mod.{n['window']}([1, 2, 3, 4, 5], 2)",
        f"mod.{n['window']}([5, 1], 3)",
        f"mod.{n['window']}([3, 1, 4, 1, 5, 9], 3)",
        f"mod.{n['clamp']}(-4)",
        f"mod.{n['clamp']}(500)",
        f"mod.{n['clamp']}({c['LOWER']})",
        f"mod.{n['clamp']}(12)",
        f"mod.{n['clamp']}({c['UPPER']})",
        "helper.smoothed([10, 20, 30, 40], 2)",
        "helper.pages(list(range(10)), 4)",
    ]
    return n, c, src, helper, calls


def _template_grades(rng: random.Random, used: set[str]) -> tuple[dict, dict, str, str, list[str]]:
    n = {
        "grade": _fn(rng, used, "grade"),
        "average": _fn(rng, used, "average"),
        "passed": _fn(rng, used, "passed"),
        "legacy": "legacy_" + _fn(rng, used),
    }
    c = {
        "A_CUTOFF": rng.choice([85, 90]),
        "B_CUTOFF": rng.choice([70, 75]),
        "PASS_MARK": rng.choice([50, 55, 60]),
    }
    src = f'''"""Letter grades, averages and pass counts."""

A_CUTOFF = {c["A_CUTOFF"]}
B_CUTOFF = {c["B_CUTOFF"]}
PASS_MARK = {c["PASS_MARK"]}


def {n["grade"]}(score):
    if score >= A_CUTOFF:
        return "A"
    if score >= B_CUTOFF:
        return "B"
    if score >= PASS_MARK:
        return "C"
    return "F"


def {n["average"]}(scores):
    if not scores:
        raise ValueError("no scores")
    return sum(scores) / len(scores)


def {n["passed"]}(scores):
    count = 0
    for score in scores:
        if score >= PASS_MARK:
            count += 1
    return count


def {n["legacy"]}(score):
    return str(score)
'''
    helper = f"""from {{module}} import {n["average"]}, {n["grade"]}, {n["passed"]}


def report(scores):
    return {n["grade"]}({n["average"]}(scores)), {n["passed"]}(scores)
"""
    a, b, p = c["A_CUTOFF"], c["B_CUTOFF"], c["PASS_MARK"]
    calls = [
        f"mod.{n['grade']}({a})",
        f"mod.{n['grade']}({a - 1})",
        f"mod.{n['grade']}({b})",
        f"mod.{n['grade']}({p})",
        f"mod.{n['grade']}({p - 1})",
        f"mod.{n['grade']}(100)",
        f"mod.{n['average']}([80, 90, 100])",
        f"mod.{n['average']}([7])",
        f"mod.{n['average']}([])",
        f"mod.{n['passed']}([{p}, {p - 1}, 99, 3])",
        f"mod.{n['passed']}([])",
        f"helper.report([{a}, {b}, {p - 10}])",
    ]
    return n, c, src, helper, calls


def _template_account(rng: random.Random, used: set[str]) -> tuple[dict, dict, str, str, list[str]]:
    cls = rng.choice(_CLASSES)
    n = {
        "cls": cls,
        "interest": _fn(rng, used, "interest"),
        "fee": _fn(rng, used, "fee"),
        "legacy": "legacy_" + _fn(rng, used),
    }
    c = {
        "WITHDRAW_FEE": rng.choice([1, 2, 3]),
        "INTEREST_RATE": rng.choice([0.01, 0.02, 0.05]),
        "MAX_BALANCE": rng.choice([1000, 5000, 10000]),
    }
    src = f'''"""A balance with deposits, withdrawals, fees and interest."""

WITHDRAW_FEE = {c["WITHDRAW_FEE"]}
INTEREST_RATE = {c["INTEREST_RATE"]}
MAX_BALANCE = {c["MAX_BALANCE"]}


class {cls}:
    def __init__(self, balance=0):
        self.balance = balance

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("deposit must be positive")
        if self.balance + amount > MAX_BALANCE:
            raise ValueError("balance limit reached")
        self.balance = self.balance + amount
        return self.balance

    def withdraw(self, amount):
        total = amount + WITHDRAW_FEE
        if total > self.balance:
            raise ValueError("insufficient funds")
        self.balance = self.balance - total
        return self.balance


def {n["interest"]}(balance, years):
    return round(balance * (1 + INTEREST_RATE) ** years, 2)


def {n["fee"]}(count):
    return count * WITHDRAW_FEE


def {n["legacy"]}(balance):
    return balance
'''
    helper = f"""from {{module}} import {cls}, {n["fee"]}, {n["interest"]}


def after_withdrawals(start, amounts):
    account = {cls}(start)
    for amount in amounts:
        account.withdraw(amount)
    return account.balance


def projected(start, years, withdrawals):
    return {n["interest"]}(start, years) - {n["fee"]}(withdrawals)
"""
    m = c["MAX_BALANCE"]
    calls = [
        f"mod.{cls}(100).deposit(50)",
        f"mod.{cls}(100).withdraw(40)",
        f"mod.{cls}(10).withdraw(10)",
        f"mod.{cls}(0).deposit(0)",
        f"mod.{cls}({m - 5}).deposit(5)",
        f"mod.{cls}({m - 5}).deposit(6)",
        f"mod.{n['interest']}(1000, 2)",
        f"mod.{n['interest']}(500, 0)",
        f"mod.{n['fee']}(4)",
        "helper.after_withdrawals(100, [10, 20])",
        "helper.projected(1000, 1, 3)",
    ]
    return n, c, src, helper, calls


def _template_text(rng: random.Random, used: set[str]) -> tuple[dict, dict, str, str, list[str]]:
    n = {
        "slug": _fn(rng, used, "slug"),
        "shorten": _fn(rng, used, "short"),
        "count": _fn(rng, used, "count"),
        "legacy": "legacy_" + _fn(rng, used),
    }
    c = {
        "SEPARATOR": rng.choice(["-", "_", "."]),
        "MAX_LENGTH": rng.randint(8, 14),
        "ELLIPSIS": rng.choice(["...", "~", ".."]),
    }
    src = f'''"""Slugs, shortening and word counts."""

SEPARATOR = {c["SEPARATOR"]!r}
MAX_LENGTH = {c["MAX_LENGTH"]}
ELLIPSIS = {c["ELLIPSIS"]!r}


def {n["slug"]}(text):
    words = [word.lower() for word in text.split()]
    return SEPARATOR.join(words)


def {n["shorten"]}(text, limit=MAX_LENGTH):
    if len(text) <= limit:
        return text
    return text[: limit - len(ELLIPSIS)] + ELLIPSIS


def {n["count"]}(text, word):
    return sum(1 for token in text.lower().split() if token == word.lower())


def {n["legacy"]}(text):
    return text.strip()
'''
    helper = f"""from {{module}} import {n["count"]}, {n["shorten"]}, {n["slug"]}


def title_key(title):
    return {n["shorten"]}({n["slug"]}(title))


def mentions(text, words):
    return {{word: {n["count"]}(text, word) for word in words}}
"""
    L = c["MAX_LENGTH"]
    calls = [
        f"mod.{n['slug']}('Hello Big World')",
        f"mod.{n['slug']}('  one  ')",
        f"mod.{n['shorten']}('x' * {L})",
        f"mod.{n['shorten']}('y' * {L + 1})",
        f"mod.{n['shorten']}('abcdefghijklmnopqrstuvwxyz', 10)",
        f"mod.{n['count']}('the cat and The dog', 'the')",
        f"mod.{n['count']}('', 'a')",
        "helper.title_key('A Very Long Title For Testing')",
        "helper.mentions('a b a c', ['a', 'c', 'z'])",
    ]
    return n, c, src, helper, calls


TEMPLATES: dict[str, Callable] = {
    "totals": _template_totals,
    "ranges": _template_ranges,
    "grades": _template_grades,
    "account": _template_account,
    "text": _template_text,
}


def make_project(template: str, seed: int) -> Project:
    rng = random.Random(f"{template}:{seed}")
    used: set[str] = set()
    names, constants, source, helper_source, calls = TEMPLATES[template](rng, used)
    module = rng.choice(_MODULES)
    helper = rng.choice(_HELPERS)
    numeric = [
        names[k]
        for k in (
            "total",
            "tax",
            "discount",
            "window",
            "average",
            "passed",
            "interest",
            "fee",
            "count",
        )
        if k in names
    ]
    return Project(
        key=f"{template}:{seed}",
        module=module,
        helper=helper,
        names=names,
        constants=constants,
        numeric_functions=numeric,
        source=source,
        helper_source=helper_source.replace("{module}", module),
        calls=calls,
    )


def write_tests(
    module: str,
    helper: str,
    source: str,
    helper_source: str,
    calls: list[str],
    extra: list[str] = (),
) -> str:
    """A unittest file asserting what the given module and helper sources compute for `calls`.

    Expected values come from executing the sources themselves; a call that raises becomes an
    assertRaises. `extra` lines are added verbatim to one more test method.
    """
    mod = _load(module, source, {})
    helper_mod = _load(helper, helper_source, {module: mod})
    lines = [
        "import unittest",
        "",
        f"import {helper} as helper",
        f"import {module} as mod",
        "",
        "",
        f"class Test{module.title().replace('_', '')}(unittest.TestCase):",
    ]
    for i, expr in enumerate(calls):
        name = re.sub(r"\W+", "_", expr.split("(")[0].split(".")[-1]).strip("_")
        lines.append(f"    def test_{name}_{i}(self):")
        try:
            value = eval(expr, {"mod": mod, "helper": helper_mod})  # noqa: S307 - our own text
        except Exception as exc:  # the code under test raises: the test expects it
            lines.append(f"        with self.assertRaises({type(exc).__name__}):")
            lines.append(f"            {expr}")
        else:
            if isinstance(value, float):
                lines.append(f"        self.assertAlmostEqual({expr}, {value!r})")
            else:
                lines.append(f"        self.assertEqual({expr}, {value!r})")
        lines.append("")
    if extra:
        lines.append("    def test_requested_change(self):")
        lines += [f"        {line}" for line in extra]
        lines.append("")
    lines += ["", 'if __name__ == "__main__":', "    unittest.main()", ""]
    return "\n".join(lines)


def _load(name: str, source: str, deps: dict) -> object:
    import types

    module = types.ModuleType(name)
    module.__file__ = f"{name}.py"
    saved = {k: sys.modules.get(k) for k in deps}
    sys.modules.update(deps)
    try:
        exec(compile(source, f"{name}.py", "exec"), module.__dict__)  # noqa: S102 - our own text
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return module


def project_files(
    p: Project,
    source: str | None = None,
    helper_source: str | None = None,
    calls: list[str] | None = None,
    extra: list[str] = (),
) -> dict[str, str]:
    source = p.source if source is None else source
    helper_source = p.helper_source if helper_source is None else helper_source
    tests = write_tests(p.module, p.helper, source, helper_source, calls or p.calls, extra)
    return {f"{p.module}.py": source, f"{p.helper}.py": helper_source, f"test_{p.module}.py": tests}


# --- tasks -----------------------------------------------------------------------------------


@dataclass
class Task:
    id: str  # sha256 of the workspace and instruction, 16 hex digits
    family: str  # e.g. "edit/rename", "bugfix/off_by_one"
    project: str  # template:seed
    split: str  # "train" or "heldout"
    instruction: str
    files: dict[str, str]  # the workspace before: path -> text
    solution: dict[str, str]  # the files that change: path -> text after the fix
    test_command: str = TEST_COMMAND  # run in the workspace root; exit 0 means solved
    notes: dict = field(default_factory=dict)  # family details (symbol, old/new values, ...)


class TaskRejected(Exception):
    """A candidate task is not verifiable (its tests pass before the fix, or fail after it)."""


def run_tests(
    files: dict[str, str], command: str = TEST_COMMAND, timeout: float = TEST_TIMEOUT_S
) -> tuple[int, str]:
    """Run `command` in a fresh temporary copy of `files`; (exit code, combined output)."""
    with tempfile.TemporaryDirectory(prefix="flywheel-task-") as tmp:
        for path, text in files.items():
            target = Path(tmp, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        return _run(command, tmp, timeout)


def _run(command: str, cwd: str, timeout: float) -> tuple[int, str]:
    argv = command.split()
    if argv[0] == "python":
        argv[0] = sys.executable
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    try:
        proc = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def verify(task: Task) -> Task:
    """Keep `task` only if its tests fail on the workspace and pass on the solution."""
    code, output = run_tests(task.files, task.test_command)
    if code == 0:
        raise TaskRejected(f"{task.family}: the tests already pass before the fix")
    if code == 124:
        raise TaskRejected(f"{task.family}: the tests hang before the fix")
    code, output = run_tests({**task.files, **task.solution}, task.test_command)
    if code != 0:
        raise TaskRejected(
            f"{task.family}: the tests fail on the reference solution: {output[-300:]}"
        )
    return task


def _task(
    family: str,
    p: Project,
    instruction: str,
    files: dict[str, str],
    solution: dict[str, str],
    heldout_fraction: float,
    **notes,
) -> Task:
    solution = {k: v for k, v in solution.items() if files.get(k) != v}
    digest = hashlib.sha256(json.dumps([instruction, files, solution], sort_keys=True).encode())
    split = "heldout" if _is_heldout(p.key, heldout_fraction) else "train"
    return Task(
        digest.hexdigest()[:16], family, p.key, split, instruction, files, solution, notes=notes
    )


def _is_heldout(key: str, fraction: float) -> bool:
    digest = hashlib.sha256(f"tasks:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def _sub_word(text: str, old: str, new: str) -> str:
    return re.sub(rf"\b{re.escape(old)}\b", new, text)


def edit_tasks(p: Project, rng: random.Random, heldout_fraction: float) -> list[Task]:
    """Instruction-explicit edits. The workspace tests already describe the target."""
    tasks = []
    mod_file, helper_file = f"{p.module}.py", f"{p.helper}.py"
    before = project_files(p)

    # rename a function everywhere it is used
    funcs = [v for k, v in p.names.items() if k not in ("cls", "legacy")]
    old = rng.choice(funcs)
    new = _fn(rng, set(funcs) | {old})
    src, hsrc = _sub_word(p.source, old, new), _sub_word(p.helper_source, old, new)
    after = project_files(p, src, hsrc, [_sub_word(c, old, new) for c in p.calls])
    phr = rng.choice(
        [
            "Rename the function `{o}` in {f} to `{n}` and update every caller.",
            "rename {o} -> {n} (in {f}), keep callers working",
            "Please rename `{o}` to `{n}`. It is defined in {f} and used elsewhere.",
        ]
    )
    tasks.append(
        _task(
            "edit/rename",
            p,
            phr.format(o=old, n=new, f=mod_file),
            {**before, f"test_{p.module}.py": after[f"test_{p.module}.py"]},
            after,
            heldout_fraction,
            old=old,
            new=new,
        )
    )

    # change a constant
    name, value = rng.choice(list(p.constants.items()))
    if isinstance(value, str):
        new_value: object = rng.choice([v for v in ["-", "_", ".", "...", "~", ":"] if v != value])
    elif isinstance(value, float):
        new_value = round(value * rng.choice([0.5, 2.0, 1.5]), 4)
    else:
        new_value = value + rng.choice([-2, -1, 1, 2, 5])
    src = p.source.replace(f"{name} = {value!r}", f"{name} = {new_value!r}", 1)
    after = project_files(p, src)
    phr = rng.choice(
        [
            "Change {c} in {f} from {o!r} to {n!r}.",
            "set {c} to {n!r}",
            "The {c} constant should be {n!r} instead of {o!r}; update {f}.",
        ]
    )
    tasks.append(
        _task(
            "edit/constant",
            p,
            phr.format(c=name, f=mod_file, o=value, n=new_value),
            {**before, f"test_{p.module}.py": after[f"test_{p.module}.py"]},
            {mod_file: src},
            heldout_fraction,
            constant=name,
            old=value,
            new=new_value,
        )
    )

    # add a keyword parameter that scales a numeric result
    func = rng.choice(p.numeric_functions)
    param = rng.choice(["scale", "factor", "multiplier", "weight"])
    src = _add_scale_parameter(p.source, func, param)
    if src is not None:
        example = next((c for c in p.calls if c.startswith(f"mod.{func}(")), None)
        calls = list(p.calls)
        if example:
            calls.append(example[:-1] + f", {param}=3)")
        after = project_files(p, src, calls=calls)
        phr = rng.choice(
            [
                "Add a keyword parameter `{p}` (default 1) to `{fn}` in {f}; the "
                "function should return its result multiplied by `{p}`.",
                "{fn} needs an optional `{p}=1` argument that multiplies what it returns",
                "Give `{fn}` a `{p}` parameter, default 1, scaling the returned value.",
            ]
        )
        tasks.append(
            _task(
                "edit/add_parameter",
                p,
                phr.format(p=param, fn=func, f=mod_file),
                {**before, f"test_{p.module}.py": after[f"test_{p.module}.py"]},
                {mod_file: src},
                heldout_fraction,
                function=func,
                parameter=param,
            )
        )

    # add an import (and the one line that uses it)
    variant = rng.choice(["logging", "pathlib"])
    if variant == "logging":
        addition = "import logging\n\nlogger = logging.getLogger(__name__)\n"
        extra = ["import logging", "self.assertIsInstance(mod.logger, logging.Logger)"]
        phr = rng.choice(
            [
                "Add `import logging` to {f} and a module-level "
                "`logger = logging.getLogger(__name__)`.",
                "{f} should define logger = logging.getLogger(__name__) (import logging)",
            ]
        )
    else:
        addition = 'from pathlib import Path\n\nDATA_DIR = Path(__file__).parent / "data"\n'
        extra = [
            "from pathlib import Path",
            "self.assertIsInstance(mod.DATA_DIR, Path)",
            'self.assertEqual(mod.DATA_DIR.name, "data")',
        ]
        phr = rng.choice(
            [
                "In {f}, import `Path` from pathlib and add a constant "
                '`DATA_DIR = Path(__file__).parent / "data"`.',
                'add DATA_DIR (a pathlib Path to the "data" folder next to {f})',
            ]
        )
    doc_end = p.source.index('"""', 3) + 4
    src = p.source[:doc_end] + "\n" + addition + p.source[doc_end:]
    tests = write_tests(p.module, p.helper, src, p.helper_source, p.calls, extra)
    tasks.append(
        _task(
            "edit/add_import",
            p,
            phr.format(f=mod_file),
            {**before, f"test_{p.module}.py": tests},
            {mod_file: src},
            heldout_fraction,
            variant=variant,
        )
    )

    # remove the unused legacy function
    legacy = p.names["legacy"]
    src = re.sub(rf"\n\n\ndef {legacy}\(.*?(?=\n\n\n|\Z)", "", p.source, flags=re.S)
    src = src.rstrip("\n") + "\n"
    tests = write_tests(
        p.module,
        p.helper,
        src,
        p.helper_source,
        p.calls,
        [f'self.assertFalse(hasattr(mod, "{legacy}"))'],
    )
    phr = rng.choice(
        [
            "Remove the unused function `{l}` from {f}.",
            "delete {l}, nothing uses it",
            "`{l}` in {f} is dead code; remove it.",
        ]
    )
    tasks.append(
        _task(
            "edit/remove_function",
            p,
            phr.format(l=legacy, f=mod_file),
            {**before, f"test_{p.module}.py": tests},
            {mod_file: src},
            heldout_fraction,
            function=legacy,
        )
    )
    del helper_file
    return tasks


def _add_scale_parameter(source: str, func: str, param: str) -> str | None:
    """Add `param=1` to `func`'s signature and multiply each of its return values by it."""
    tree = ast.parse(source)
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func), None)
    if node is None:
        return None
    lines = source.splitlines(keepends=True)
    for ret in sorted(
        (n for n in ast.walk(node) if isinstance(n, ast.Return) and n.value),
        key=lambda n: -n.lineno,
    ):
        value = ret.value
        if value.lineno != value.end_lineno:
            return None
        line = lines[value.lineno - 1]
        expr = line[value.col_offset : value.end_col_offset]
        lines[value.lineno - 1] = (
            line[: value.col_offset] + f"({expr}) * {param}" + line[value.end_col_offset :]
        )
    header = lines[node.lineno - 1]
    lines[node.lineno - 1] = header.replace("):", f", {param}=1):", 1)
    return "".join(lines)


# --- bug-fix mutations -----------------------------------------------------------------------

_OPERATOR_SWAPS = {"+": "-", "-": "+", "*": "/", "/": "*", "//": "/", "%": "//", "**": "*"}
_COMPARISON_SWAPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}


@dataclass
class Mutation:
    family: str  # bugfix/...
    line: int  # 1-based line in the module
    before: str  # the original line
    after: str  # the mutated line


def mutations(source: str) -> list[Mutation]:
    """Every single-token mutation we know how to make, in source order.

    Each replaces one span on one line: a binary operator, a comparison, an integer literal
    (+-1), or the first two arguments of a call.
    """
    tree = ast.parse(source)
    lines = source.splitlines()
    found: list[Mutation] = []

    def replace(family: str, lineno: int, start: int, end: int, text: str) -> None:
        line = lines[lineno - 1]
        found.append(Mutation(family, lineno, line, line[:start] + text + line[end:]))

    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and node.left.end_lineno == node.right.lineno:
            line = lines[node.lineno - 1]
            gap = line[node.left.end_col_offset : node.right.col_offset]
            op = gap.strip().strip("()").strip()
            if op in _OPERATOR_SWAPS:
                start = node.left.end_col_offset + gap.index(op)
                replace(
                    "bugfix/operator_swap", node.lineno, start, start + len(op), _OPERATOR_SWAPS[op]
                )
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            right = node.comparators[0]
            if node.left.end_lineno != right.lineno:
                continue
            line = lines[node.lineno - 1]
            gap = line[node.left.end_col_offset : right.col_offset]
            op = gap.strip()
            if op in _COMPARISON_SWAPS:
                start = node.left.end_col_offset + gap.index(op)
                replace(
                    "bugfix/comparison", node.lineno, start, start + len(op), _COMPARISON_SWAPS[op]
                )
        elif (
            isinstance(node, ast.Constant)
            and type(node.value) is int
            and node.lineno == node.end_lineno
            and node.col_offset > 0
        ):
            line = lines[node.lineno - 1]
            if re.match(r"\s*[A-Z_]+ = ", line):  # constants are for edit tasks, not bugs
                continue
            for delta in (1, -1):
                replace(
                    "bugfix/off_by_one",
                    node.lineno,
                    node.col_offset,
                    node.end_col_offset,
                    str(node.value + delta),
                )
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and not node.keywords:
            a, b = node.args[0], node.args[1]
            if not (a.lineno == a.end_lineno == b.lineno == b.end_lineno):
                continue
            line = lines[a.lineno - 1]
            ta = line[a.col_offset : a.end_col_offset]
            tb = line[b.col_offset : b.end_col_offset]
            if ta == tb:
                continue
            mutated = line[: a.col_offset] + tb + line[a.end_col_offset : b.col_offset] + ta
            found.append(
                Mutation(
                    "bugfix/swapped_arguments", a.lineno, line, mutated + line[b.end_col_offset :]
                )
            )
    for node in ast.walk(tree):  # `len(x) - 1` style off-by-one in range/slice bounds
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "range" and node.args:
            arg = node.args[-1]
            if arg.lineno == arg.end_lineno and not isinstance(arg, ast.Constant):
                line = lines[arg.lineno - 1]
                text = line[arg.col_offset : arg.end_col_offset]
                replace(
                    "bugfix/off_by_one",
                    arg.lineno,
                    arg.col_offset,
                    arg.end_col_offset,
                    f"{text} - 1",
                )
    return sorted(found, key=lambda m: (m.line, m.family, m.after))


_BUG_PHRASES = [
    "The tests in {t} fail. Find the bug and fix it without changing the tests.",
    "fix the failing tests",
    "Something is wrong in {f}: {test} fails. Please fix it.",
    "{test} is failing, can you fix the code?",
    "Run the tests, find out why they fail and fix the code (not the tests).",
]


def bugfix_tasks(p: Project, rng: random.Random, heldout_fraction: float, limit: int) -> list[Task]:
    """Up to `limit` tasks from mutating the module; the tests are the original, passing ones."""
    files = project_files(p)
    mod_file, test_file = f"{p.module}.py", f"test_{p.module}.py"
    candidates = mutations(p.source)
    rng.shuffle(candidates)
    tasks: list[Task] = []
    seen_families: dict[str, int] = {}
    for m in sorted(candidates, key=lambda m: seen_families.get(m.family, 0)):
        if len(tasks) >= limit:
            break
        if seen_families.get(m.family, 0) >= max(1, limit // 3):
            continue
        lines = p.source.splitlines(keepends=True)
        lines[m.line - 1] = m.after + "\n"
        broken = "".join(lines)
        code, output = run_tests({**files, mod_file: broken})
        if code in (0, 124):
            continue  # tests do not notice this mutation (or it hangs): not a verifiable task
        failing = re.findall(r"(?:FAIL|ERROR): (test_\w+)", output)
        test = failing[0] if failing else "a test"
        instruction = rng.choice(_BUG_PHRASES).format(t=test_file, f=mod_file, test=test)
        task = _task(
            m.family,
            p,
            instruction,
            {**files, mod_file: broken},
            {mod_file: p.source},
            heldout_fraction,
            line=m.line,
            mutated=m.after.strip(),
            original=m.before.strip(),
            failing=failing,
        )
        tasks.append(task)  # the fix restores the original module, whose tests pass
        seen_families[m.family] = seen_families.get(m.family, 0) + 1
    return tasks


def generate_tasks(
    projects: int,
    seed: int = 0,
    heldout_fraction: float = 0.1,
    bugs_per_project: int = 3,
    log: Callable[[str], None] | None = None,
    workers: int = 1,
) -> list[Task]:
    """Tasks from `projects` projects (templates in turn), every one verified by running tests.

    With `workers` > 1 the projects are built in that many processes; the tasks are the same
    (each project draws from its own seeded generator) and come back in project order.
    """
    names = sorted(TEMPLATES)
    jobs = [
        (names[i % len(names)], seed * 100_000 + i, heldout_fraction, bugs_per_project)
        for i in range(projects)
    ]
    tasks: list[Task] = []
    rejected = 0
    for project_tasks, rejections in in_order(_project_tasks, jobs, workers):
        tasks += project_tasks
        rejected += len(rejections)
        for line in rejections if log else ():
            log(line)
    if log:
        log(f"{len(tasks)} tasks from {projects} projects ({rejected} edit candidates rejected)")
    return tasks


def _project_tasks(job: tuple[str, int, float, int]) -> tuple[list[Task], list[str]]:
    """One project's verified tasks and the rejected candidates' reasons (a worker's unit)."""
    template, project_seed, heldout_fraction, bugs_per_project = job
    project = make_project(template, project_seed)
    code, output = run_tests(project_files(project))
    if code != 0:  # a template bug, not a task: say so loudly
        raise RuntimeError(f"project {project.key} does not pass its own tests:\n{output[-800:]}")
    rng = random.Random(f"tasks:{project.key}")
    tasks, rejections = [], []
    for task in edit_tasks(project, rng, heldout_fraction):
        try:
            tasks.append(verify(task))
        except TaskRejected as exc:
            rejections.append(f"rejected {project.key}: {exc}")
    tasks += bugfix_tasks(project, rng, heldout_fraction, bugs_per_project)
    return tasks, rejections


def in_order(fn: Callable, items: list, workers: int):
    """`map(fn, items)`, in `workers` processes when > 1; results in the order of `items`.

    Generating tasks waits mostly on the sandboxed test runs, not on the CPU: on the 2-core
    machine, 5 projects took 18.7 s of wall time and 4.8 s of CPU, the test runs' included
    (bash `time`). Several processes overlap those waits: 250 projects took 9.5 min in 4
    processes beside the starter's pretraining; 44.7 min in one, beside pretraining and another
    job, before.
    """
    if workers <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # no fork of a process that holds threads
    with ProcessPoolExecutor(min(workers, len(items)), mp_context=context) as pool:
        yield from pool.map(fn, items)


def default_workers() -> int:
    """Processes for task generation: twice the cores (the work waits on subprocesses), <= 8."""
    return max(1, min(8, 2 * (os.cpu_count() or 1)))


# --- oracle trajectories ---------------------------------------------------------------------


def hunks_for(old: str, new: str) -> list[dict[str, str]]:
    """Search/replace hunks turning `old` into `new`: the fewest lines of context that make each
    search text unique in `old` (a small model copies less, and misquotes less)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    for context in (0, 1, 2, 3, 5, 8, len(a)):
        groups = difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(context)
        hunks = []
        for group in groups:
            i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
            if i1 == i2 and i1 > 0:  # pure insertion: anchor on the line before
                i1, j1 = i1 - 1, j1 - 1
            elif i1 == i2:
                i2, j2 = i2 + 1, j2 + 1
            hunks.append({"search": "".join(a[i1:i2]), "replace": "".join(b[j1:j2])})
        if all(h["search"] and old.count(h["search"]) == 1 for h in hunks):
            return hunks
    return [{"search": old, "replace": new}]


def apply_hunks(text: str, hunks: list[dict[str, str]]) -> str:
    for hunk in hunks:
        if text.count(hunk["search"]) != 1:
            raise ValueError(f"hunk search text is not unique: {hunk['search'][:80]!r}")
        text = text.replace(hunk["search"], hunk["replace"], 1)
    return text


class HarnessScratch:
    """A scratch copy of a task's workspace, with the harness's own tools running on it.

    Tool results are exactly what `agent.harness.tools.run_tool` returns at run time (the same
    numbering, edit reports, test summaries, sandbox). The project's tests run with the task's
    own command (`ToolsConfig.test_command`), as the evaluation and RL rollouts configure it.
    """

    def __init__(self, task: Task) -> None:
        from agent.harness import Sandbox, ToolContext, Workspace

        self.root = Path(tempfile.mkdtemp(prefix="flywheel-oracle-"))
        for path, text in task.files.items():
            Path(self.root, path).write_text(text)
        self.workspace = Workspace(self.root)
        self.ctx = ToolContext(self.workspace, Sandbox(self.root), task_tools_config(task))

    def call(self, name: str, args: dict) -> tuple[str, bool]:
        from agent.harness import run_tool

        return run_tool(self.ctx, name, args)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def task_tools_config(task: Task):
    """The harness's tool settings for a task: its own test command (oracle, evaluation, RL)."""
    from agent.harness import ToolsConfig

    return ToolsConfig(test_command=task.test_command, test_timeout_s=TEST_TIMEOUT_S)


_INTROS = [
    "",
    "",
    "Let me look at the project first.",
    "I'll start by looking around.",
    "First, the layout.",
    "Checking the files.",
]
_TEST_INTROS = [
    "",
    "Let me run the tests to see what fails.",
    "Running the tests first.",
    "I'll reproduce the failure.",
]
_READ_INTROS = ["", "", "Reading {f}.", "Let me read {f}.", "Opening {f}."]
_EDIT_INTROS = [
    "",
    "",
    "Now the fix.",
    "Making the change in {f}.",
    "Editing {f}.",
    "Found it: updating {f}.",
]
_VERIFY_INTROS = [
    "",
    "Checking the tests again.",
    "Running the tests to confirm.",
    "Let me verify.",
]
_ANSWERS = {
    "bugfix": [
        "Fixed: in {f}, `{old}` should have been `{new}`. The tests pass now.",
        "The bug was on line {line} of {f} (`{old}` instead of `{new}`). Fixed; all tests pass.",
        "Done. {f} line {line} now reads `{new}`, and the test suite passes.",
    ],
    "edit": [
        "Done: {summary}. Tests pass.",
        "{summary}; the tests pass.",
        "Changed {files}: {summary}. All tests pass.",
    ],
}


def oracle_trajectory(task: Task, rng: random.Random) -> dict:
    """A correct, varied trajectory for `task`: {"messages", "tools", "task_id", "family"}.

    The conversation is what the harness builds at run time: its system prompt, the task with
    its repository map (agent.harness.prompts / context), its tool schemas, and tool results from
    the harness's own tools run on a scratch copy of the workspace. The final `run_tests` result
    shows the tests passing; a trajectory that would not get there raises `TaskRejected`.
    """
    from agent.harness import HarnessConfig
    from agent.harness.context import render_context
    from agent.harness.prompts import first_messages, tool_schemas

    scratch = HarnessScratch(task)
    context = render_context(scratch.workspace, task.instruction, None, HarnessConfig().map_tokens)
    messages: list[dict] = first_messages(task.instruction, context)
    counter = iter(range(1, 1000))

    def step(content: str, *calls: tuple[str, dict]) -> list[tuple[str, bool]]:
        tool_calls = [
            {
                "id": f"call_{next(counter)}",
                "type": "function",
                "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)},
            }
            for n, a in calls
        ]
        messages.append({"role": "assistant", "content": content, "tool_calls": tool_calls})
        results = []
        for call, (name, args) in zip(tool_calls, calls, strict=True):
            result, is_error = scratch.call(name, args)
            results.append((result, is_error))
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "name": name, "content": result}
            )
        return results

    try:
        changed = sorted(task.solution)
        bug = task.family.startswith("bugfix/")
        if rng.random() < 0.5:
            step(rng.choice(_INTROS), ("list_files", {}))
        if bug and rng.random() < 0.7:
            step(rng.choice(_TEST_INTROS), ("run_tests", {}))
        symbol = (
            task.notes.get("old")
            if task.family == "edit/rename"
            else task.notes.get("function") or task.notes.get("constant")
        )
        if symbol and isinstance(symbol, str) and rng.random() < 0.5:
            step(
                rng.choice(["", f"Where is `{symbol}` used?", f"Searching for {symbol}."]),
                ("search", {"pattern": rf"\b{re.escape(symbol)}\b"}),
            )
        for path in changed:
            text = task.files.get(path, "")
            n_lines = len(text.splitlines())
            if bug and "line" in task.notes and rng.random() < 0.3 and n_lines > 20:
                line = task.notes["line"]
                args = {"path": path, "start_line": max(1, line - 8), "end_line": line + 8}
            else:
                args = {"path": path}
            step(rng.choice(_READ_INTROS).format(f=path), ("read_file", args))
        if rng.random() < 0.25:
            test_file = next(p for p in task.files if p.startswith("test_"))
            step(rng.choice(["", "And the tests."]), ("read_file", {"path": test_file}))
        for path in changed:
            old, new = task.files.get(path, ""), task.solution[path]
            intro = rng.choice(_EDIT_INTROS).format(f=path)
            if not old or (rng.random() < 0.12 and len(new) < 3000):
                results = step(intro, ("write_file", {"path": path, "content": new}))
            else:
                results = step(intro, ("edit_file", {"path": path, "hunks": hunks_for(old, new)}))
            if results[0][1]:
                raise TaskRejected(f"oracle edit failed for task {task.id}: {results[0][0][:300]}")
        step(rng.choice(_VERIFY_INTROS), ("run_tests", {}))
        if not messages[-1]["content"].startswith("tests passed"):
            raise TaskRejected(f"oracle for task {task.id} did not make the tests pass")
        messages.append({"role": "assistant", "content": _answer(task, rng)})
    finally:
        scratch.close()
    return {
        "task_id": task.id,
        "family": task.family,
        "split": task.split,
        "tools": tool_schemas(),
        "messages": messages,
    }


def _answer(task: Task, rng: random.Random) -> str:
    notes = task.notes
    if task.family.startswith("bugfix/"):
        return rng.choice(_ANSWERS["bugfix"]).format(
            f=next(iter(task.solution)),
            old=notes["mutated"],
            new=notes["original"],
            line=notes["line"],
        )
    summary = {
        "edit/rename": f"renamed `{notes.get('old')}` to `{notes.get('new')}` everywhere",
        "edit/constant": f"set {notes.get('constant')} to {notes.get('new')!r}",
        "edit/add_parameter": f"`{notes.get('function')}` takes `{notes.get('parameter')}=1`",
        "edit/add_import": f"added the {notes.get('variant')} import and its constant",
        "edit/remove_function": f"removed `{notes.get('function')}`",
    }[task.family]
    return rng.choice(_ANSWERS["edit"]).format(summary=summary, files=", ".join(task.solution))


# --- fast apply ------------------------------------------------------------------------------


def edit_sketch(old: str, new: str, context: int = 1) -> str:
    """The changed lines of `new` with `context` lines around them; gaps become markers."""
    a, b = old.splitlines(), new.splitlines()
    out: list[str] = []
    groups = list(difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(context))
    for k, group in enumerate(groups):
        j1, j2 = group[0][3], group[-1][4]
        if j1 > 0 or k > 0:
            out.append("# ... existing code ...")
        out += b[j1:j2]
    if groups and groups[-1][-1][4] < len(b):
        out.append("# ... existing code ...")
    return "\n".join(out) + "\n"


def fast_apply_example(task: Task, rng: random.Random) -> dict:
    path = next(iter(task.solution))
    original, updated = task.files[path], task.solution[path]
    sketch = edit_sketch(original, updated, rng.choice([0, 1, 2]))
    return {
        "task_id": task.id,
        "family": "apply",
        "split": task.split,
        "messages": apply_messages(path, original, sketch, updated),
    }


# --- export ----------------------------------------------------------------------------------


def export(
    tasks: list[Task], out: str | Path, seed: int = 0, samples_per_task: int = 1, workers: int = 1
) -> dict:
    """Write tasks.jsonl, trajectories.jsonl, apply.jsonl (each row has its split) + manifest.

    Each task's trajectories and fast-apply example draw from a generator seeded by `seed` and
    the task's id, so the output does not depend on `workers` (processes running the oracles),
    except for what the test runs print that varies anyway (timings, scratch-folder names).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {"tasks": {}, "trajectories": 0, "apply": 0}
    jobs = [(task, seed, samples_per_task) for task in tasks]
    with (
        (out / "tasks.jsonl").open("w") as tf,
        (out / "trajectories.jsonl").open("w") as jf,
        (out / "apply.jsonl").open("w") as af,
    ):
        for task, (rows, failed, apply_row) in zip(
            tasks, in_order(_task_rows, jobs, workers), strict=True
        ):
            tf.write(json.dumps(asdict(task)) + "\n")
            counts["tasks"][task.split] = counts["tasks"].get(task.split, 0) + 1
            for row in rows:
                jf.write(json.dumps(row) + "\n")
            counts["trajectories"] += len(rows)
            if failed:
                counts["oracle_failed"] = counts.get("oracle_failed", 0) + failed
            af.write(json.dumps(apply_row) + "\n")
            counts["apply"] += 1
    families: dict[str, int] = {}
    for task in tasks:
        families[task.family] = families.get(task.family, 0) + 1
    manifest = {
        "format": "flywheel-tasks/1",
        "counts": counts,
        "families": families,
        "test_command": TEST_COMMAND,
        "seed": seed,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def _task_rows(job: tuple[Task, int, int]) -> tuple[list[dict], int, dict]:
    """One task's oracle trajectories, how many failed, and its fast-apply example."""
    task, seed, samples = job
    rng = random.Random(f"export:{seed}:{task.id}")
    rows, failed = [], 0
    for _ in range(samples):
        try:
            rows.append(oracle_trajectory(task, rng))
        except TaskRejected:
            failed += 1
    return rows, failed, fast_apply_example(task, rng)


def load_tasks(path: str | Path, split: str | None = None) -> list[Task]:
    path = Path(path)
    file = path / "tasks.jsonl" if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"no tasks at {str(file)!r}; make them with `flywheel train tasks`")
    tasks = [Task(**json.loads(line)) for line in file.read_text().splitlines() if line.strip()]
    return [t for t in tasks if split is None or t.split == split]
