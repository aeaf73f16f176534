"""inventory: unit writes counted, so that a full sync keeps rows an event wrote during its listing

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('inventory_status', sa.Column('unit_writes', sa.BigInteger(), server_default=sa.text('0'), nullable=False))
    op.add_column('devices', sa.Column('unit_write', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column('devices', 'unit_write')
    op.drop_column('inventory_status', 'unit_writes')
