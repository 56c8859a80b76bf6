"""Database access shared by the services: schema (SQLAlchemy MetaData + Alembic migrations), connections and RLS
transactions, the content write path and the API's reads. Service-private SQL lives with its service
(kdbl_worker.jobs, kdbl_operator.db_sync); docs/architecture.md "Database access" says what is still on SQLAlchemy."""
