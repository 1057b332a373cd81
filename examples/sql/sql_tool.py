"""A `sql` tool over this example's shop database (a class tool: the database is opened once per
run in `setup` and closed in `close`). Read-only: one SELECT per call.

    tools.enabled: [examples.sql.sql_tool:Sql]      # run arpo from the repository root
"""

import sqlite3
from pathlib import Path

DB_SQL = Path(__file__).with_name("shop.sql")


class Sql:
    """Query the shop database (tables customers(id, name, city) and orders(id, customer_id, product,
    quantity, price)) with one SQLite SELECT statement; returns the result rows."""

    name = "sql"

    def setup(self) -> None:
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.executescript(DB_SQL.read_text())

    def __call__(self, query: str) -> str:
        """Run one SELECT statement on the shop database.

        Args:
            query: a single SQLite SELECT statement
        """
        q = query.strip().rstrip(";")
        if not q.lower().startswith("select") or ";" in q:
            raise ValueError("only one SELECT statement is allowed")
        rows = self.db.execute(q).fetchmany(20)
        if not rows:
            return "(no rows)"
        return "\n".join(" | ".join("NULL" if v is None else str(v) for v in r) for r in rows)

    def close(self) -> None:
        self.db.close()
