"""reservation journal and device cordon

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('reservations',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('claim_uid', sa.String(length=64), nullable=False),
    sa.Column('claim_namespace', sa.String(length=63), nullable=False),
    sa.Column('claim_name', sa.String(length=253), nullable=False),
    sa.Column('request', sa.String(length=255), nullable=False),
    sa.Column('mode', sa.String(length=16), nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=False),
    sa.Column('device_name', sa.String(length=63), nullable=False),
    sa.Column('pool', sa.String(length=253), nullable=False),
    sa.Column('exclusive', sa.Boolean(), nullable=False),
    sa.Column('node', sa.String(length=253), nullable=True),
    sa.Column('host_id', sa.String(length=1024), nullable=True),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('operation_id', sa.String(length=1024), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('attached_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('released_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], name=op.f('fk_reservations_device_id_devices')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_reservations'))
    )
    op.create_index('ix_reservations_claim_uid', 'reservations', ['claim_uid'], unique=False)
    op.create_index('ix_reservations_state', 'reservations', ['state'], unique=False)
    op.create_index('uq_reservations_active_device', 'reservations', ['device_id'], unique=True, sqlite_where=sa.text("exclusive AND state != 'released'"), postgresql_where=sa.text("exclusive AND state != 'released'"))
    op.add_column('devices', sa.Column('cordoned_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('devices', sa.Column('cordon_reason', sa.String(length=255), nullable=True))


def downgrade() -> None:
    op.drop_column('devices', 'cordon_reason')
    op.drop_column('devices', 'cordoned_at')
    op.drop_index('uq_reservations_active_device', table_name='reservations', sqlite_where=sa.text("exclusive AND state != 'released'"), postgresql_where=sa.text("exclusive AND state != 'released'"))
    op.drop_index('ix_reservations_state', table_name='reservations')
    op.drop_index('ix_reservations_claim_uid', table_name='reservations')
    op.drop_table('reservations')
