"""mcp servers: the version the `current` flag names (moves on publish and rollback)

Revision ID: 0100_mcp_selected_version
Revises: 0090_serverless
Create Date: 2026-11-25 17:20:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0100_mcp_selected_version'
down_revision = '0090_serverless'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('mcp_servers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('selected_version', sa.Integer(), nullable=True))
    # Existing servers: a build under way or failed was the last publish (the newest version); otherwise
    # the version that serves is the current one.
    newest = "(SELECT MAX(v.version) FROM mcp_versions v WHERE v.server_id = mcp_servers.id)"
    op.execute(
        "UPDATE mcp_servers SET selected_version = CASE WHEN status IN ('building', 'deploying', 'failed') "
        f"THEN {newest} ELSE COALESCE(current_version, {newest}) END"
    )


def downgrade() -> None:
    with op.batch_alter_table('mcp_servers', schema=None) as batch_op:
        batch_op.drop_column('selected_version')
