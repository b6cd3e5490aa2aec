"""agents: an index on the name alone (the owner gate and the invoke target find agents by name in
every project the caller sees; the unique (project_id, name) index does not serve that lookup)

Revision ID: 0120_agents_name_index
Revises: 0110_cluster_memorystores_mcp
Create Date: 2026-11-26 07:25:00
"""
from alembic import op


revision = '0120_agents_name_index'
down_revision = '0110_cluster_memorystores_mcp'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_agents_name'), ['name'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_agents_name'))
