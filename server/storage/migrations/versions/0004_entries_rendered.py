"""entries keep their API form: a batch lookup reads one column instead of the row, its stores
and its tags

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05

``rendered`` holds an entry's JSON object as the API returns it, up to its usage stamps (hit
count and last use change on every hit and are read beside it), written by the server that
registered the entry; ``rendered_format`` says which server's rendering it is. Readers use it
only when the format is theirs, and otherwise answer from the row, its stores and its tags, as
before.

Why it cannot go stale: the database itself clears ``rendered`` whenever anything it was made
from changes, so a writer that does not know the column (an older replica during a rolling
update, an operator's SQL) can only make a lookup slower, never wrong:
- an UPDATE that names any column of the API form (every column but the usage stamps and the
  rendering itself) clears it on the row;
- an insert, update or delete of a location or a tag clears it on its entry.
The server renders again after its own changes, in the same transaction. A later migration that
adds a column to the API form must add it to ``_FORM`` below (drop and create the triggers).

The partial index holds only unrendered rows, so finding what to render (after this migration,
or after an older writer) costs nothing when there is nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_FORM = ("path", "layout", "key", "namespace", "compiler_version", "target", "lnc", "toolchain", "state", "size",
         "neff_sha256", "created", "registered", "updated", "producer", "compile_seconds", "hlo_sha256",
         "hlo_size", "flags")
_CHILDREN = ("entry_locations", "entry_tags")


def upgrade() -> None:
    op.add_column("entries", sa.Column("rendered", sa.LargeBinary(), nullable=True))
    op.add_column("entries", sa.Column("rendered_format", sa.Integer(), nullable=True))
    op.create_index("ix_entries_unrendered", "entries", ["id"],
                    sqlite_where=sa.text("rendered IS NULL"), postgresql_where=sa.text("rendered IS NULL"))
    if op.get_bind().dialect.name == "postgresql":
        _postgresql_triggers()
    else:
        _sqlite_triggers()


# The SQL below is built from this file's own constants only (S608 is about values from outside).
def _sqlite_triggers() -> None:
    columns = ", ".join(_FORM)
    op.execute(f"CREATE TRIGGER entries_form_changed AFTER UPDATE OF {columns} ON entries "  # noqa: S608
               "WHEN NEW.rendered IS NOT NULL BEGIN UPDATE entries SET rendered = NULL WHERE id = NEW.id; END")
    for table in _CHILDREN:
        for event, row in (("INSERT", "NEW"), ("DELETE", "OLD"), ("UPDATE", "OLD"), ("UPDATE", "NEW")):
            name = f"{table}_{event.lower()}_{row.lower()}"
            op.execute(f"CREATE TRIGGER {name} AFTER {event} ON {table} BEGIN UPDATE entries SET rendered = NULL "  # noqa: S608
                       f"WHERE id = {row}.entry_id AND rendered IS NOT NULL; END")


def _postgresql_triggers() -> None:
    op.execute("CREATE FUNCTION neffcache_entry_form_changed() RETURNS trigger LANGUAGE plpgsql AS $$ "
               "BEGIN NEW.rendered := NULL; RETURN NEW; END $$")
    op.execute(f"CREATE TRIGGER entries_form_changed BEFORE UPDATE OF {', '.join(_FORM)} ON entries "
               "FOR EACH ROW EXECUTE FUNCTION neffcache_entry_form_changed()")
    op.execute("CREATE FUNCTION neffcache_entry_part_changed() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
               "IF TG_OP <> 'INSERT' THEN "
               "UPDATE entries SET rendered = NULL WHERE id = OLD.entry_id AND rendered IS NOT NULL; END IF; "
               "IF TG_OP <> 'DELETE' THEN "
               "UPDATE entries SET rendered = NULL WHERE id = NEW.entry_id AND rendered IS NOT NULL; END IF; "
               "RETURN NULL; END $$")
    for table in _CHILDREN:
        op.execute(f"CREATE TRIGGER {table}_changed AFTER INSERT OR UPDATE OR DELETE ON {table} "
                   "FOR EACH ROW EXECUTE FUNCTION neffcache_entry_part_changed()")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in _CHILDREN:
            op.execute(f"DROP TRIGGER {table}_changed ON {table}")
        op.execute("DROP TRIGGER entries_form_changed ON entries")
        op.execute("DROP FUNCTION neffcache_entry_part_changed()")
        op.execute("DROP FUNCTION neffcache_entry_form_changed()")
    else:
        op.execute("DROP TRIGGER entries_form_changed")
        for table in _CHILDREN:
            for event, row in (("insert", "new"), ("delete", "old"), ("update", "old"), ("update", "new")):
                op.execute(f"DROP TRIGGER {table}_{event}_{row}")
    op.drop_index("ix_entries_unrendered", table_name="entries")
    op.drop_column("entries", "rendered_format")
    op.drop_column("entries", "rendered")
