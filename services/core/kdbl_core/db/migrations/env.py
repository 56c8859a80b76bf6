"""Alembic environment: migrations run online, as the owner role, on the URL given by kdbl_core.db.migrate."""

from alembic import context
from sqlalchemy import create_engine, pool

config = context.config
url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")

engine = create_engine(url, poolclass=pool.NullPool)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=None, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
