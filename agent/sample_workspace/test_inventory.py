from inventory import low_stock, restock, total_value


def test_total_value():
    assert total_value([("nut", 2, 10), ("bolt", 3, 5)]) == 35


def test_restock_adds():
    assert restock({"nut": 4}, "nut", 6) == {"nut": 10}


def test_restock_new_item():
    assert restock({}, "bolt", 3) == {"bolt": 3}


def test_low_stock():
    assert low_stock({"nut": 1, "bolt": 9, "gear": 0}, 2) == ["gear", "nut"]
