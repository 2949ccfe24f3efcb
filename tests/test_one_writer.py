"""One writer per fact: the call journal (turnstile.stores.journal and its
modules journal_writes, journal_repair) is the only code that writes the
call facts — `tool_call_ledger`, `tool_execution_log`, `approval_decision` —
and every other table of the stores has one writing module too (`OWNERS`).

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
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FACTS = frozenset({"tool_call_ledger", "tool_execution_log", "approval_decision"})
JOURNAL = frozenset({"turnstile/stores/journal.py", "turnstile/stores/journal_writes.py",
                     "turnstile/stores/journal_repair.py"})
WRITES = ("insert", "update", "delete", "upsert")
# Every table of the stores and the one module that writes it (the call facts:
# the journal, whose statements are in journal_writes).
OWNERS = {
    "approval_decision": "turnstile/stores/journal_writes.py",
    "approval_grant": "turnstile/stores/grant_store.py",
    "chat_message": "turnstile/stores/memory.py",
    "chat_message_part": "turnstile/stores/message_parts.py",
    "conversation": "turnstile/stores/memory.py",
    "conversation_lock": "turnstile/stores/lock.py",
    "grant_use": "turnstile/stores/grant_store.py",
    "model_usage": "turnstile/stores/usage.py",
    "payload_blob": "turnstile/stores/payload_store.py",
    "quarantined_message": "turnstile/stores/quarantine.py",
    "payload_ref": "turnstile/stores/payload_store.py",
    "retrieval_document": "turnstile/stores/retrieval_index.py",
    "schema_revision": "turnstile/stores/schema_window.py",
    "superseded_message": "turnstile/stores/superseded.py",
    "tool_call_ledger": "turnstile/stores/journal_writes.py",
    "tool_execution_log": "turnstile/stores/journal_writes.py",
    "turn_stream": "turnstile/stores/streaming.py",
}


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


def _tables(tree: ast.AST, tables: frozenset[str]) -> dict[str, str]:
    """Names that stand for one of `tables` in a module, each with the table's
    name: the tables' own names, names bound to them (`t = tool_call_ledger`,
    `import ... as t`) and `sa.Table("tool_call_ledger", ...)` assignments."""
    names = {t: t for t in tables}
    changed = True
    while changed:  # aliases of aliases
        changed = False
        for node in ast.walk(tree):
            found: dict[str, str] = {}
            if isinstance(node, ast.ImportFrom):
                found = {a.asname: names[a.name] for a in node.names
                         if a.asname and a.name in names}
            elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                value = node.value
                table = names.get(_name(value) or "")
                if (table is None and isinstance(value, ast.Call)
                        and _name(value.func) == "Table"):
                    table = next((a.value for a in value.args if isinstance(a, ast.Constant)
                                  and a.value in tables), None)
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if table is not None:
                    found = {n: table for t in targets if (n := _name(t)) is not None}
            if found.keys() - names.keys():
                names |= found
                changed = True
    return names


def _sql_write(tables: frozenset[str]) -> re.Pattern[str]:
    return re.compile(r"\b(?:insert\s+(?:or\s+\w+\s+)?into|update|delete\s+from)\s+[\"`]?"
                      f"({'|'.join(sorted(tables))})\\b", re.IGNORECASE)


def table_writes(source: str, tables: frozenset[str]) -> list[tuple[str, str]]:
    """Every write of one of `tables` in `source`, as (table, "line: what")."""
    tree = ast.parse(source)
    named = _tables(tree, tables)
    sql_write = _sql_write(tables)

    def table(node: ast.expr) -> str | None:
        return named.get(_name(node) or "")

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = _name(node.func) or ""
            given = [t for a in [*node.args, *(k.value for k in node.keywords)]
                     if (t := table(a)) is not None]
            if given and any(w in func.lower() for w in WRITES):
                found.append((given[0], f"{node.lineno}: {func}(<{given[0]}>)"))
            elif (isinstance(node.func, ast.Attribute) and node.func.attr in WRITES
                  and (t := table(node.func.value)) is not None):
                found.append((t, f"{node.lineno}: <{t}>.{node.func.attr}()"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in sql_write.finditer(node.value):
                found.append((m.group(1).lower(), f"{node.lineno}: SQL {m.group(0)!r}"))
    return found


def writes(source: str) -> list[str]:
    """Every write of a call-fact table in `source`, as "line: what"."""
    return [what for _, what in table_writes(source, FACTS)]


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


def test_every_table_has_one_writing_module() -> None:
    """Each table of the stores is written (INSERT, UPDATE, DELETE) by its
    owner only, and the owner does write it."""
    import turnstile.stores
    from turnstile.stores.tables import metadata

    for module in pkgutil.iter_modules(turnstile.stores.__path__):  # each declares its own
        importlib.import_module(f"turnstile.stores.{module.name}")
    assert set(metadata.tables) == set(OWNERS)
    by_table: dict[str, set[str]] = {}
    for path, src in _sources().items():
        for table, _ in table_writes(src, frozenset(OWNERS)):
            by_table.setdefault(table, set()).add(path)
    assert by_table == {table: {owner} for table, owner in OWNERS.items()}


def test_product_code_reads_no_dict_rows() -> None:
    """Rows come back as typed rows (Connection.rows/row/scalars/scalar);
    raw-SQL dict reads are the tests' own (tests/support/sql.py)."""
    from turnstile.stores.connection import Connection

    assert not hasattr(Connection, "fetchall") and not hasattr(Connection, "fetchone")
    found = {path: n for path, src in _sources().items()
             if (n := len(re.findall(r"\.fetch(?:all|one)\(", src)))}
    assert found == {}


@pytest.mark.parametrize("planted", [
    "import sqlalchemy as sa\nconn.execute(sa.insert(tool_call_ledger).values(x=1))",
    "from sqlalchemy.dialects import postgresql\n"
    "postgresql.insert(audit.tool_execution_log).on_conflict_do_nothing()",
    "conn.execute(tool_execution_log.update().values(status='FAILED'))",
    "t = approval_decision\nconn.execute(sa.delete(t))",
    "from turnstile.stores.ledger import tool_call_ledger as calls\nsa.update(calls)",
    "log = sa.Table('tool_execution_log', metadata)\nconn.execute(log.insert())",
    "conn.execute(_insert(conn, tool_call_ledger).values(x=1))",
    "conn.upsert(approval_decision, {'x': 1})",
    'conn.execute("INSERT INTO tool_call_ledger (workflow_id) VALUES (:wf)")',
    'conn.execute("update tool_execution_log set status = :s")',
    'conn.execute("insert or replace into \\"approval_decision\\" values (1)")',
    'conn.execute(f"DELETE FROM approval_decision WHERE workflow_id = {wf!r}")',
])
def test_a_planted_write_is_caught(planted: str) -> None:
    assert writes(planted) != []


@pytest.mark.parametrize("clean", [
    "rows = conn.rows(sa.select(tool_call_ledger).where(c.status == 'STARTED'), Row)",
    'fetchall(conn, "SELECT status FROM tool_execution_log WHERE execution_id = :k")',
    "conn.execute(sa.insert(model_usage).values(x=1))",
    'conn.execute("INSERT INTO chat_message (seq) VALUES (1)")',
    '"""Every INSERT and UPDATE of the call facts is the journal\'s."""',
])
def test_reads_and_other_tables_are_not_writes(clean: str) -> None:
    assert writes(clean) == []
