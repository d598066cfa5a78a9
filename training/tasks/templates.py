"""Project templates: eight small modules, their helper modules and the calls their tests check.

Each template draws symbol names from the name pools (names.py) and constants from a seeded
generator and returns (names, constants, module source, helper source, calls). `{module}` in the
helper source stands for the module's file name, which `make_project` picks from `MODULE_NAMES`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from training.tasks.names import CLASSES, function_name


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
    cls = rng.choice(CLASSES)
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


def _template_tally(rng: random.Random, used: set[str]) -> tuple[dict, dict, str, str, list[str]]:
    n = {
        "add": function_name(rng, used, "count"),
        "remove": function_name(rng, used, "count"),
        "top": function_name(rng, used, "leaders"),
        "score": function_name(rng, used, "score"),
        "legacy": "legacy_" + function_name(rng, used),
    }
    c = {
        "TOP_COUNT": rng.choice([2, 3]),
        "MIN_COUNT": rng.choice([1, 2]),
        "POINTS": rng.choice([5, 10, 20]),
    }
    src = f'''"""Named counts kept in a dict: adding, removing, ranking."""

TOP_COUNT = {c["TOP_COUNT"]}
MIN_COUNT = {c["MIN_COUNT"]}
POINTS = {c["POINTS"]}


def {n["add"]}(tally, name, amount):
    """Add `amount` to the count of `name` (a new name starts at 0)."""
    tally[name] = tally.get(name, 0) + amount
    return tally


def {n["remove"]}(tally, name, amount):
    """Take `amount` from `name`; a count that drops below MIN_COUNT is removed."""
    left = tally.get(name, 0) - amount
    if left < MIN_COUNT:
        tally.pop(name, None)
    else:
        tally[name] = left
    return tally


def {n["top"]}(tally, limit=TOP_COUNT):
    """The `limit` names with the highest counts, ties by name."""
    ranked = sorted(tally.items(), key=lambda item: (-item[1], item[0]))
    return [name for name, _ in ranked[:limit]]


def {n["score"]}(tally, name):
    return tally.get(name, 0) * POINTS


def {n["legacy"]}(tally):
    return dict(tally)
'''
    helper = f"""from {{module}} import {n["add"]}, {n["top"]}


def from_pairs(pairs):
    tally = {{}}
    for name, amount in pairs:
        {n["add"]}(tally, name, amount)
    return tally


def leaders(pairs, limit):
    return {n["top"]}(from_pairs(pairs), limit)
"""
    m = c["MIN_COUNT"]
    calls = [
        f"mod.{n['add']}({{'a': 2}}, 'a', 3)",
        f"mod.{n['add']}({{}}, 'b', 4)",
        f"mod.{n['remove']}({{'a': 5}}, 'a', 2)",
        f"mod.{n['remove']}({{'a': 2}}, 'a', 2)",
        f"mod.{n['remove']}({{'a': 5}}, 'a', {5 - m})",
        f"mod.{n['top']}({{'a': 1, 'b': 3, 'c': 2, 'd': 3}})",
        f"mod.{n['top']}({{'x': 1}}, 5)",
        f"mod.{n['score']}({{'a': 3}}, 'a')",
        f"mod.{n['score']}({{}}, 'z')",
        "helper.from_pairs([('a', 1), ('b', 2), ('a', 3)])",
        "helper.leaders([('a', 1), ('b', 2), ('c', 2)], 2)",
    ]
    return n, c, src, helper, calls


def _template_queue(rng: random.Random, used: set[str]) -> tuple[dict, dict, str, str, list[str]]:
    cls = rng.choice(CLASSES)
    n = {
        "cls": cls,
        "drain": function_name(rng, used, "batch"),
        "retries": function_name(rng, used, "retries"),
        "legacy": "legacy_" + function_name(rng, used),
    }
    c = {
        "CAPACITY": rng.choice([4, 5, 6]),
        "BATCH_SIZE": rng.choice([2, 3]),
        "RETRY_LIMIT": rng.choice([2, 3, 4]),
    }
    src = f'''"""A bounded first-in, first-out queue of jobs."""

CAPACITY = {c["CAPACITY"]}
BATCH_SIZE = {c["BATCH_SIZE"]}
RETRY_LIMIT = {c["RETRY_LIMIT"]}


class {cls}:
    def __init__(self, capacity=CAPACITY):
        self.items = []
        self.capacity = capacity

    def push(self, item):
        if len(self.items) >= self.capacity:
            raise OverflowError("queue is full")
        self.items.append(item)
        return len(self.items)

    def pop(self):
        if len(self.items) == 0:
            raise IndexError("queue is empty")
        return self.items.pop(0)

    def free(self):
        return self.capacity - len(self.items)


def {n["drain"]}(queue, count=BATCH_SIZE):
    taken = []
    for _ in range(min(count, len(queue.items))):
        taken.append(queue.pop())
    return taken


def {n["retries"]}(attempts):
    return max(0, RETRY_LIMIT - attempts)


def {n["legacy"]}(queue):
    return list(queue.items)
'''
    helper = f"""from {{module}} import {cls}, {n["drain"]}


def filled(capacity, items):
    queue = {cls}(capacity)
    for item in items:
        queue.push(item)
    return queue


def first_batch(items, count):
    return {n["drain"]}(filled(len(items) + 1, items), count)
"""
    r = c["RETRY_LIMIT"]
    calls = [
        f"mod.{cls}(2).push('a')",
        "helper.filled(3, ['a', 'b']).free()",
        "helper.filled(2, ['a', 'b', 'c'])",
        "helper.filled(2, ['a', 'b']).items",
        f"mod.{cls}().pop()",
        "helper.filled(3, ['a', 'b']).pop()",
        f"mod.{cls}().capacity",
        f"mod.{n['drain']}(helper.filled(6, ['a', 'b', 'c', 'd']))",
        f"mod.{n['drain']}(helper.filled(5, ['a']), 3)",
        "helper.first_batch(['x', 'y', 'z'], 2)",
        f"mod.{n['retries']}(1)",
        f"mod.{n['retries']}({r + 1})",
    ]
    return n, c, src, helper, calls


def _template_orders(rng: random.Random, used: set[str]) -> tuple[dict, dict, str, str, list[str]]:
    n = {
        "total_of": function_name(rng, used, "total"),
        "large": function_name(rng, used, "orders"),
        "shipping": function_name(rng, used, "shipping"),
        "group": function_name(rng, used, "orders"),
        "legacy": "legacy_" + function_name(rng, used),
    }
    c = {
        "MIN_QUANTITY": rng.choice([1, 2, 3]),
        "SHIPPING_FEE": rng.choice([3, 5, 7]),
        "FREE_SHIPPING_OVER": rng.choice([50, 100]),
    }
    src = f'''"""Order records as dicts: totals, filters, shipping and grouping."""

MIN_QUANTITY = {c["MIN_QUANTITY"]}
SHIPPING_FEE = {c["SHIPPING_FEE"]}
FREE_SHIPPING_OVER = {c["FREE_SHIPPING_OVER"]}


def {n["total_of"]}(orders):
    return sum(order["price"] * order["quantity"] for order in orders)


def {n["large"]}(orders, minimum=MIN_QUANTITY):
    """Names of the orders of more than `minimum` items."""
    return [order["name"] for order in orders if order["quantity"] > minimum]


def {n["shipping"]}(amount):
    if amount >= FREE_SHIPPING_OVER:
        return 0
    return SHIPPING_FEE


def {n["group"]}(orders):
    """Order names by kind, in order of appearance."""
    groups = {{}}
    for order in orders:
        groups.setdefault(order["kind"], []).append(order["name"])
    return groups


def {n["legacy"]}(orders):
    return len(orders)
'''
    helper = f"""from {{module}} import {n["shipping"]}, {n["total_of"]}


def order(name, kind, price, quantity):
    return {{"name": name, "kind": kind, "price": price, "quantity": quantity}}


def checkout(orders):
    amount = {n["total_of"]}(orders)
    return amount + {n["shipping"]}(amount)
"""
    q, f = c["MIN_QUANTITY"], c["FREE_SHIPPING_OVER"]
    o = "helper.order"
    calls = [
        f"mod.{n['total_of']}([{o}('a', 'x', 2, 3), {o}('b', 'y', 5, 1)])",
        f"mod.{n['total_of']}([])",
        f"mod.{n['large']}([{o}('a', 'x', 1, {q}), {o}('b', 'x', 1, {q + 1})])",
        f"mod.{n['large']}([{o}('a', 'x', 1, 1), {o}('b', 'y', 1, 0)], 0)",
        f"mod.{n['shipping']}({f})",
        f"mod.{n['shipping']}({f - 1})",
        f"mod.{n['group']}([{o}('a', 'x', 1, 1), {o}('b', 'y', 1, 1), {o}('c', 'x', 1, 1)])",
        f"helper.checkout([{o}('a', 'x', 10, 2)])",
        f"helper.checkout([{o}('a', 'x', {f}, 1)])",
    ]
    return n, c, src, helper, calls


TEMPLATES: dict[str, Callable] = {
    "totals": _template_totals,
    "ranges": _template_ranges,
    "grades": _template_grades,
    "account": _template_account,
    "text": _template_text,
    "tally": _template_tally,
    "queue": _template_queue,
    "orders": _template_orders,
}
