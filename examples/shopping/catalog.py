"""A small deterministic product catalog for the demo shopping agent's tools."""

from __future__ import annotations

import hashlib
from typing import Any

_PRODUCTS = [
    ("headphones", 5900), ("laptop", 89900), ("coffee grinder", 4900), ("running shoes", 11900),
    ("backpack", 6900), ("desk lamp", 2900), ("water bottle", 1900), ("keyboard", 7900),
    ("monitor", 21900), ("office chair", 24900), ("blender", 8900), ("umbrella", 2400),
]
_BRANDS = ["Acme", "Northwind", "Contoso", "Globex"]


def _score(name: str) -> float:
    return 3.0 + int(hashlib.sha256(name.encode()).hexdigest()[:4], 16) % 200 / 100


ITEMS: list[dict[str, Any]] = [
    {"id": f"sku-{i * len(_BRANDS) + j:03d}", "name": f"{brand} {product}",
     "price_cents": price + j * 700, "rating": round(_score(f"{brand} {product}"), 2)}
    for i, (product, price) in enumerate(_PRODUCTS)
    for j, brand in enumerate(_BRANDS)
]
BY_ID = {item["id"]: item for item in ITEMS}


def search(query: str, limit: int = 5) -> list[dict[str, Any]]:
    words = {w for w in query.lower().split() if len(w) > 2}
    hits = [item for item in ITEMS if words & set(item["name"].lower().split())]
    hits = hits or ITEMS
    return sorted(hits, key=lambda i: (-i["rating"], i["id"]))[:limit]
