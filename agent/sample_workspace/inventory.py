"""A small stock-keeping module: the demo's sample project."""


def total_value(items):
    """Sum of price * quantity over (name, price, quantity) tuples."""
    return sum(price * quantity for _, price, quantity in items)


def restock(levels, name, amount):
    """Add `amount` to the stock level of `name` (new items start at 0)."""
    levels[name] = levels.get(name, 0) - amount
    return levels


def low_stock(levels, threshold):
    """Names whose level is below `threshold`, sorted."""
    return sorted(name for name, level in levels.items() if level < threshold)
