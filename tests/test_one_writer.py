"""One writer per fact: the call journal (turnstile.stores.journal and its
modules journal_writes, journal_repair) is the only code that writes the
call facts — `tool_call_ledger`, `tool_execution_log`, `approval_decision`.

Every module of the worker (turnstile/, activities/, workflows/, worker.py,
starter.py) is parsed: a write is a Core statement on one of those tables
(`sa.insert(t)`, `postgresql.insert(t)`, `sa.update(t)`, `sa.delete(t)`,
`t.insert()`, `t.update()`, `t.delete()`, a helper whose name says insert,
update or delete given the table; `t` the Table or any name bound to it) or
SQL text that inserts into, updates or deletes from one of them. Pure: no
database, no server.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FACTS = frozenset({"tool_call_ledger", "tool_execution_log", "approval_decision"})
JOURNAL = frozenset({"turnstile/stores/journal.py", "turnstile/stores/journal_writes.py",
                     "turnstile/stores/journal_repair.py"})
WRITES = ("insert", "update", "delete")
SQL_WRITE = re.compile(r"\b(?:insert\s+(?:or\s+\w+\s+)?into|update|delete\s+from)\s+[\"`]?"
                       f"({'|'.join(sorted(FACTS))})\\b", re.IGNORECASE)


def _sources() -> dict[str, str]:
    paths = [p for top in ("turnstile", "activities", "workflows")
             for p in (ROOT / top).rglob("*.py")]
    paths += [ROOT / "worker.py", ROOT / "starter.py"]
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in paths}


def _name(node: ast.expr) -> str | None:
    """`x` of `x` or `a.b.x`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _tables(tree: ast.AST) -> set[str]:
    """Names that stand for a fact table in a module: the tables' own names,
    names bound to them (`t = tool_call_ledger`, `import ... as t`) and
    `sa.Table("tool_call_ledger", ...)` assignments."""
    names = set(FACTS)
    changed = True
    while changed:  # aliases of aliases
        changed = False
        for node in ast.walk(tree):
            found: set[str] = set()
            if isinstance(node, ast.ImportFrom):
                found = {a.asname for a in node.names if a.asname and a.name in names}
            elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                value = node.value
                named = _name(value) in names or (
                    isinstance(value, ast.Call) and _name(value.func) == "Table"
                    and any(isinstance(a, ast.Constant) and a.value in FACTS
                            for a in value.args))
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if named:
                    found = {n for t in targets if (n := _name(t)) is not None}
            if found - names:
                names |= found
                changed = True
    return names


def writes(source: str) -> list[str]:
    """Every write of a fact table in `source`, as "line: what"."""
    tree = ast.parse(source)
    tables = _tables(tree)

    def is_table(node: ast.expr) -> bool:
        return _name(node) in tables

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = _name(node.func) or ""
            given = [a for a in [*node.args, *(k.value for k in node.keywords)] if is_table(a)]
            if given and any(w in func.lower() for w in WRITES):
                found.append(f"{node.lineno}: {func}(<{_name(given[0])}>)")
            elif (isinstance(node.func, ast.Attribute) and node.func.attr in WRITES
                  and is_table(node.func.value)):
                found.append(f"{node.lineno}: <{_name(node.func.value)}>.{node.func.attr}()")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in SQL_WRITE.finditer(node.value):
                found.append(f"{node.lineno}: SQL {m.group(0)!r}")
    return found


def test_only_the_journal_writes_the_call_facts() -> None:
    sources = _sources()
    assert JOURNAL <= set(sources)
    elsewhere = {path: found for path, src in sources.items()
                 if path not in JOURNAL and (found := writes(src))}
    assert elsewhere == {}


def test_the_journal_does_write_them() -> None:
    """The scanner sees the journal's own statements: each table is written."""
    found = " ".join(w for path in JOURNAL for w in writes(_sources()[path]))
    for table in FACTS:
        assert f"<{table}>" in found, (table, found)
    assert "insert" in found and "update" in found


@pytest.mark.parametrize("planted", [
    "import sqlalchemy as sa\nconn.execute(sa.insert(tool_call_ledger).values(x=1))",
    "from sqlalchemy.dialects import postgresql\n"
    "postgresql.insert(audit.tool_execution_log).on_conflict_do_nothing()",
    "conn.execute(tool_execution_log.update().values(status='FAILED'))",
    "t = approval_decision\nconn.execute(sa.delete(t))",
    "from turnstile.stores.ledger import tool_call_ledger as calls\nsa.update(calls)",
    "log = sa.Table('tool_execution_log', metadata)\nconn.execute(log.insert())",
    "conn.execute(_insert(conn, tool_call_ledger).values(x=1))",
    'conn.execute("INSERT INTO tool_call_ledger (workflow_id) VALUES (:wf)")',
    'conn.execute("update tool_execution_log set status = :s")',
    'conn.execute("insert or replace into \\"approval_decision\\" values (1)")',
    'conn.execute(f"DELETE FROM approval_decision WHERE workflow_id = {wf!r}")',
])
def test_a_planted_write_is_caught(planted: str) -> None:
    assert writes(planted) != []


@pytest.mark.parametrize("clean", [
    "rows = conn.fetchall(sa.select(tool_call_ledger).where(c.status == 'STARTED'))",
    'conn.fetchall("SELECT status FROM tool_execution_log WHERE execution_id = :k")',
    "conn.execute(sa.insert(model_usage).values(x=1))",
    'conn.execute("INSERT INTO chat_message (seq) VALUES (1)")',
    '"""Every INSERT and UPDATE of the call facts is the journal\'s."""',
])
def test_reads_and_other_tables_are_not_writes(clean: str) -> None:
    assert writes(clean) == []
