"""reservations: an index of the active reservations by device, for the check that a device is free

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index('ix_reservations_active_device_id', 'reservations', ['device_id'], unique=False, sqlite_where=sa.text("state != 'released'"), postgresql_where=sa.text("state != 'released'"))


def downgrade() -> None:
    op.drop_index('ix_reservations_active_device_id', table_name='reservations', sqlite_where=sa.text("state != 'released'"), postgresql_where=sa.text("state != 'released'"))
