"""erasures: a user's erasure (POST /v1/projects/{projectID}/forget), its progress, receipt and claim

Revision ID: 0160_erasures
Revises: 0150_vector_engine_settings
Create Date: 2026-12-07 17:55:00
"""
import sqlalchemy as sa
from alembic import op

from caiplatform.db.base import UTCDateTime

revision = '0160_erasures'
down_revision = '0150_vector_engine_settings'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'erasures',
        sa.Column('id', sa.String(length=36), nullable=False),
        sa.Column('project_id', sa.String(length=36), nullable=False),
        sa.Column('user_id', sa.String(length=128), nullable=False),
        sa.Column('scope', sa.Text(), nullable=False),
        sa.Column('agents', sa.JSON(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('requested_by', sa.String(length=320), nullable=False),
        sa.Column('receipts', sa.JSON(), nullable=False),
        sa.Column('claimed_by', sa.String(length=128), nullable=True),
        sa.Column('lease_until', UTCDateTime(timezone=True), nullable=True),
        sa.Column('created_at', UTCDateTime(timezone=True), nullable=False),
        sa.Column('started_at', UTCDateTime(timezone=True), nullable=True),
        sa.Column('finished_at', UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['project_id'], ['projects.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_erasures_project_id', 'erasures', ['project_id'])
    op.create_index('ix_erasures_state', 'erasures', ['state'])
    op.create_index('ix_erasures_user', 'erasures', ['project_id', 'user_id'])
    op.create_index('uq_erasures_unfinished', 'erasures', ['project_id', 'user_id', 'scope'], unique=True,
                    sqlite_where=sa.text("state != 'done'"), postgresql_where=sa.text("state != 'done'"))


def downgrade() -> None:
    op.drop_index('uq_erasures_unfinished', table_name='erasures')
    op.drop_index('ix_erasures_user', table_name='erasures')
    op.drop_index('ix_erasures_state', table_name='erasures')
    op.drop_index('ix_erasures_project_id', table_name='erasures')
    op.drop_table('erasures')
