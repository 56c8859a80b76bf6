"""Database access: the only package that imports SQLAlchemy or psycopg."""
