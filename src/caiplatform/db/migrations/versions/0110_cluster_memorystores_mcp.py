"""replicas: memory store records in the database; MCP servers keep one workload key and name their owner

Revision ID: 0110_cluster_memorystores_mcp
Revises: 0100_mcp_selected_version
Create Date: 2026-11-25 20:00:00
"""
from alembic import op
import sqlalchemy as sa
import caiplatform.db.base


revision = '0110_cluster_memorystores_mcp'
down_revision = '0100_mcp_selected_version'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('memorystore_instances',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('project_id', sa.String(length=36), nullable=False),
    sa.Column('name', sa.String(length=40), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('folder', sa.Text(), nullable=False),
    sa.Column('password', sa.Text(), nullable=False),
    sa.Column('pending_password', sa.Text(), nullable=True),
    sa.Column('host', sa.String(length=64), nullable=False),
    sa.Column('port', sa.Integer(), nullable=False),
    sa.Column('owner', sa.String(length=100), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('transitions', sa.JSON(), nullable=False),
    sa.Column('restart_seq', sa.Integer(), nullable=False),
    sa.Column('applied_restart_seq', sa.Integer(), nullable=False),
    sa.Column('deleting', sa.Boolean(), nullable=False),
    sa.Column('created_at', caiplatform.db.base.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', caiplatform.db.base.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_memorystore_instances_project_id_projects'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_memorystore_instances')),
    sa.UniqueConstraint('project_id', 'name', name='uq_memorystore_instances_project_name')
    )
    with op.batch_alter_table('mcp_servers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('workload_key_id', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('workload_key', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('owner', sa.String(length=100), nullable=False, server_default=''))


def downgrade() -> None:
    with op.batch_alter_table('mcp_servers', schema=None) as batch_op:
        batch_op.drop_column('owner')
        batch_op.drop_column('workload_key')
        batch_op.drop_column('workload_key_id')
    op.drop_table('memorystore_instances')
