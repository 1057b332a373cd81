"""Builds this example's data: shop.sql (a small shop database as SQL text) and the question sets
train.jsonl (worked examples: question, the SQL call that answers it, the answer) and heldout.jsonl
(question, answer). Deterministic: `python examples/sql/make_data.py` rewrites the committed files."""

import json
import random
import sqlite3
from pathlib import Path

HERE = Path(__file__).parent
CITIES = ["Lyon", "Porto", "Graz", "Turku", "Ghent", "Bergen"]
FIRST = ["Ada", "Ben", "Cleo", "Dara", "Emil", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Milo", "Nia",
         "Omar", "Pia", "Quin", "Rosa", "Sami", "Tess"]
PRODUCTS = [("lamp", 25), ("chair", 60), ("desk", 140), ("mug", 8), ("rug", 90), ("shelf", 75), ("clock", 30)]


def build_sql(rng: random.Random) -> str:
    lines = ["CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT);",
             "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, product TEXT, quantity INTEGER, "
             "price INTEGER);"]
    for i, name in enumerate(FIRST, 1):
        lines.append(f"INSERT INTO customers VALUES ({i}, '{name}', '{rng.choice(CITIES)}');")
    for oid in range(1, 121):
        prod, price = rng.choice(PRODUCTS)
        lines.append(f"INSERT INTO orders VALUES ({oid}, {rng.randint(1, len(FIRST))}, '{prod}', "
                     f"{rng.randint(1, 4)}, {price});")
    return "\n".join(lines) + "\n"


def questions(db: sqlite3.Connection, rng: random.Random) -> list[dict]:
    q = lambda sql: db.execute(sql).fetchall()  # noqa: E731
    out = []
    for name in FIRST:
        out.append((f"How many orders did {name} place?",
                    f"SELECT COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.id WHERE c.name = '{name}'"))
        out.append((f"How much did {name} spend in total (quantity times price)?",
                    f"SELECT SUM(o.quantity * o.price) FROM orders o JOIN customers c ON o.customer_id = c.id "
                    f"WHERE c.name = '{name}'"))
    for city in CITIES:
        out.append((f"How many customers live in {city}?", f"SELECT COUNT(*) FROM customers WHERE city = '{city}'"))
    for prod, _ in PRODUCTS:
        out.append((f"How many {prod}s were ordered in total (sum of quantities)?",
                    f"SELECT SUM(quantity) FROM orders WHERE product = '{prod}'"))
    for oid in rng.sample(range(1, 121), 40):
        out.append((f"Which customer placed order {oid}?",
                    f"SELECT c.name FROM orders o JOIN customers c ON o.customer_id = c.id WHERE o.id = {oid}"))
    rows = []
    for question, sql in out:
        (ans,) = q(sql)[0]
        rows.append({"question": question, "sql": sql, "answer": str(0 if ans is None else ans)})
    rng.shuffle(rows)
    return rows


def main() -> None:
    rng = random.Random(0)
    sql = build_sql(rng)
    (HERE / "shop.sql").write_text(sql)
    db = sqlite3.connect(":memory:")
    db.executescript(sql)
    rows = questions(db, rng)
    held, train = rows[:30], rows[30:]
    with open(HERE / "train.jsonl", "w") as f:
        for r in train:
            f.write(json.dumps({"question": r["question"], "answer": r["answer"], "task": "qa",
                                "calls": [{"tool": "sql", "arguments": {"query": r["sql"]},
                                           "thought": "I look it up in the shop database."}]}) + "\n")
    with open(HERE / "heldout.jsonl", "w") as f:
        for r in held:
            f.write(json.dumps({"question": r["question"], "answer": r["answer"], "task": "qa"}) + "\n")
    print(f"shop.sql: {len(FIRST)} customers, 120 orders; train.jsonl {len(train)}, heldout.jsonl {len(held)}")


if __name__ == "__main__":
    main()
