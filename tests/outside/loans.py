"""A small app of someone else's (installed as a dependency, run from its own
folder by tests/test_package_install.py): lend a book, with an approval."""

import sqlalchemy as sa

from turnstile import App, Service, ToolContext, ToolRegistry, tool
from turnstile.testing import FunctionModel, ModelCall, Reply, call

metadata = sa.MetaData()
loans = sa.Table("loan", metadata,
                 sa.Column("id", sa.Integer, primary_key=True),
                 sa.Column("book", sa.Text, nullable=False),
                 sa.Column("member", sa.Text, nullable=False))


@tool(transactional=True, requires_approval=True)
def lendBook(ctx: ToolContext, book: str, member: str) -> dict[str, str]:
    """Lend a book to a member."""
    with ctx.transaction() as conn:
        conn.execute(sa.insert(loans).values(book=book, member=member))
    return {"lent": book, "to": member}


def offline_model(request: ModelCall) -> Reply:
    """Lend the book the message names to member m-1, then say what was lent."""
    done = request.result_of("lendBook")
    if done is None:
        return call("lendBook", book=request.user_text.split()[-1], member="m-1")
    if done.is_error:  # e.g. the desk said no
        return f"Not lent: {done.text}"
    return f"Lent {done.result['lent']} to {done.result['to']}"


app = App(
    name="loans",
    services=[Service(name="loans", tools=ToolRegistry([lendBook]),
                      system_prompt="You run a library's loans desk.",
                      offline_model=FunctionModel(offline_model))],
    tables=[loans],
)
