"""Project templates: five small modules, their helper modules and the calls their tests check.

Each template draws symbol names from the name pools and constants from a seeded generator and
returns (names, constants, module source, helper source, calls). `{module}` in the helper source
stands for the module's file name, which `make_project` picks from `MODULE_NAMES`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

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
MODULE_NAMES = sorted({w + s for w in _MODULE_WORDS for s in _MODULE_SUFFIXES})
HELPER_NAMES = [
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


def _fresh(rng: random.Random, pool: list[str], used: set[str]) -> str:
    for _ in range(100):
        name = rng.choice(pool)
        if name not in used:
            used.add(name)
            return name
    name = f"{rng.choice(pool)}_{len(used)}"
    used.add(name)
    return name


def function_name(rng: random.Random, used: set[str], noun: str | None = None) -> str:
    """A `verb_noun` function name not yet in `used` (the noun given or drawn), added to it."""
    return _fresh(rng, [f"{v}_{noun or n}" for v in _VERBS for n in _NOUNS], used)


def _template_totals(rng: random.Random, used: set[str]) -> tuple[dict, dict, str, str, list[str]]:
    n = {
        "total": function_name(rng, used, "total"),
        "tax": function_name(rng, used, "with_tax"),
        "discount": function_name(rng, used, "discount"),
        "legacy": "legacy_" + function_name(rng, used),
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
        "chunk": function_name(rng, used, "chunks"),
        "window": function_name(rng, used, "window_sums"),
        "clamp": function_name(rng, used, "clamped"),
        "legacy": "legacy_" + function_name(rng, used),
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
        "grade": function_name(rng, used, "grade"),
        "average": function_name(rng, used, "average"),
        "passed": function_name(rng, used, "passed"),
        "legacy": "legacy_" + function_name(rng, used),
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
        "interest": function_name(rng, used, "interest"),
        "fee": function_name(rng, used, "fee"),
        "legacy": "legacy_" + function_name(rng, used),
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
        "slug": function_name(rng, used, "slug"),
        "shorten": function_name(rng, used, "short"),
        "count": function_name(rng, used, "count"),
        "legacy": "legacy_" + function_name(rng, used),
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
