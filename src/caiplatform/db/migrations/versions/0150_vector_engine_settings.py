"""vector_indexes: engine_settings, the Qdrant knobs an index was created with (hnsw_config,
indexing_threshold); NULL for every index created before, which keeps the engine's defaults

Revision ID: 0150_vector_engine_settings
Revises: 0140_agent_secrets_sealed
Create Date: 2026-12-01 21:40:00
"""
import sqlalchemy as sa
from alembic import op


revision = '0150_vector_engine_settings'
down_revision = '0140_agent_secrets_sealed'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('vector_indexes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('engine_settings', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('vector_indexes', schema=None) as batch_op:
        batch_op.drop_column('engine_settings')
