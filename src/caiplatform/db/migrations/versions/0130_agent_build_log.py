"""agent_builds.log: the build's log lines, for GET /v1/agents/{name}/logs/build

Revision ID: 0130_agent_build_log
Revises: 0120_agents_name_index
Create Date: 2026-12-01 20:50:00
"""
import sqlalchemy as sa
from alembic import op


revision = '0130_agent_build_log'
down_revision = '0120_agents_name_index'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('agent_builds', schema=None) as batch_op:
        batch_op.add_column(sa.Column('log', sa.Text(), server_default='', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('agent_builds', schema=None) as batch_op:
        batch_op.drop_column('log')
