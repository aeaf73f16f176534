"""Alembic environment. Run in-process by :mod:`app.db.migrate` on a live connection.

The connection comes in ``config.attributes["connection"]`` (a synchronous facade of an async
connection, via ``run_sync``), so migrations run inside the service's event loop; Alembic's own
async template would call ``asyncio.run()`` and fail there (PITFALLS.md).
"""

from alembic import context

from app.db.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "run migrations with `fabric-dra db upgrade` (app.db.migrate), not the alembic command"
    )

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
