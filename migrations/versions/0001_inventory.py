"""inventory: hosts, devices, device events, sync status

Revision ID: 0001
Revises: (none)
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('devices',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('backend', sa.String(length=32), nullable=False),
    sa.Column('vendor_id', sa.String(length=1024), nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('attach_unit', sa.String(length=1024), nullable=False),
    sa.Column('device_type', sa.String(length=32), nullable=False),
    sa.Column('vendor_name', sa.String(length=255), nullable=True),
    sa.Column('vendor', sa.String(length=255), nullable=True),
    sa.Column('model', sa.String(length=255), nullable=True),
    sa.Column('serial', sa.String(length=255), nullable=True),
    sa.Column('uuid', sa.String(length=64), nullable=True),
    sa.Column('part_number', sa.String(length=255), nullable=True),
    sa.Column('firmware_version', sa.String(length=255), nullable=True),
    sa.Column('memory_mib', sa.BigInteger(), nullable=True),
    sa.Column('capacity', sa.JSON(), nullable=False),
    sa.Column('attributes', sa.JSON(), nullable=False),
    sa.Column('health', sa.String(length=16), nullable=False),
    sa.Column('state', sa.String(length=64), nullable=True),
    sa.Column('host_id', sa.String(length=1024), nullable=True),
    sa.Column('shareable', sa.Boolean(), nullable=False),
    sa.Column('content_hash', sa.String(length=64), nullable=False),
    sa.Column('first_seen', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen', sa.DateTime(timezone=True), nullable=False),
    sa.Column('health_changed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('removed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('region', sa.String(length=255), nullable=True),
    sa.Column('zone', sa.String(length=255), nullable=True),
    sa.Column('site', sa.String(length=255), nullable=True),
    sa.Column('row', sa.String(length=255), nullable=True),
    sa.Column('rack', sa.String(length=255), nullable=True),
    sa.Column('chassis', sa.String(length=255), nullable=True),
    sa.Column('slot', sa.String(length=255), nullable=True),
    sa.Column('fabric', sa.String(length=255), nullable=True),
    sa.Column('fabric_zone', sa.String(length=255), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_devices')),
    sa.UniqueConstraint('backend', 'vendor_id', name=op.f('uq_devices_backend_vendor_id')),
    sa.UniqueConstraint('name', name=op.f('uq_devices_name'))
    )
    op.create_index('ix_devices_region_rack', 'devices', ['region', 'rack'], unique=False)
    op.create_table('hosts',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('backend', sa.String(length=32), nullable=False),
    sa.Column('host_id', sa.String(length=1024), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=True),
    sa.Column('hostname', sa.String(length=255), nullable=True),
    sa.Column('uuid', sa.String(length=64), nullable=True),
    sa.Column('serial', sa.String(length=255), nullable=True),
    sa.Column('health', sa.String(length=16), nullable=False),
    sa.Column('attached_units', sa.JSON(), nullable=False),
    sa.Column('content_hash', sa.String(length=64), nullable=False),
    sa.Column('first_seen', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen', sa.DateTime(timezone=True), nullable=False),
    sa.Column('removed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('region', sa.String(length=255), nullable=True),
    sa.Column('zone', sa.String(length=255), nullable=True),
    sa.Column('site', sa.String(length=255), nullable=True),
    sa.Column('row', sa.String(length=255), nullable=True),
    sa.Column('rack', sa.String(length=255), nullable=True),
    sa.Column('chassis', sa.String(length=255), nullable=True),
    sa.Column('slot', sa.String(length=255), nullable=True),
    sa.Column('fabric', sa.String(length=255), nullable=True),
    sa.Column('fabric_zone', sa.String(length=255), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_hosts')),
    sa.UniqueConstraint('backend', 'host_id', name=op.f('uq_hosts_backend_host_id'))
    )
    op.create_index(op.f('ix_hosts_hostname'), 'hosts', ['hostname'], unique=False)
    op.create_table('inventory_status',
    sa.Column('backend', sa.String(length=32), nullable=False),
    sa.Column('last_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_success_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('consecutive_failures', sa.Integer(), nullable=False),
    sa.Column('stale', sa.Boolean(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('device_count', sa.Integer(), nullable=False),
    sa.Column('host_count', sa.Integer(), nullable=False),
    sa.Column('rejected_count', sa.Integer(), nullable=False),
    sa.Column('last_rejects', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('backend', name=op.f('pk_inventory_status'))
    )
    op.create_table('device_events',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('old', sa.String(length=1024), nullable=True),
    sa.Column('new', sa.String(length=1024), nullable=True),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], name=op.f('fk_device_events_device_id_devices'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_device_events'))
    )
    op.create_index(op.f('ix_device_events_at'), 'device_events', ['at'], unique=False)
    op.create_index(op.f('ix_device_events_device_id'), 'device_events', ['device_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_device_events_device_id'), table_name='device_events')
    op.drop_index(op.f('ix_device_events_at'), table_name='device_events')
    op.drop_table('device_events')
    op.drop_table('inventory_status')
    op.drop_index(op.f('ix_hosts_hostname'), table_name='hosts')
    op.drop_table('hosts')
    op.drop_index('ix_devices_region_rack', table_name='devices')
    op.drop_table('devices')
