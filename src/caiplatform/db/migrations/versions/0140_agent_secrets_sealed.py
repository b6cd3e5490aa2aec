"""agent_secrets: every value sealed with the platform's secret key (AES-256-GCM, caiplatform.secret_box)
instead of plain text, and so is the platform's default model key (platform_settings 'model_api_key');
the downgrade opens them again

Revision ID: 0140_agent_secrets_sealed
Revises: 0130_agent_build_log
Create Date: 2026-12-01 21:00:00
"""
import os

import sqlalchemy as sa
from alembic import context, op

revision = '0140_agent_secrets_sealed'
down_revision = '0130_agent_build_log'
branch_labels = None
depends_on = None

SECRETS = sa.table('agent_secrets', sa.column('agent_id', sa.String), sa.column('key', sa.String),
                   sa.column('value', sa.Text))
SETTINGS = sa.table('platform_settings', sa.column('key', sa.String), sa.column('value', sa.Text))
MODEL_KEY = 'model_api_key'


def _box():
    """The platform's box (`Database.migrate(secret_box=...)`), or one from CAI_SECRETS_KEY for the `alembic`
    command line; None when neither is there."""
    box = context.config.attributes.get('secret_box')
    if box is None and os.environ.get('CAI_SECRETS_KEY'):
        from caiplatform.secret_box import SecretBox
        box = SecretBox(os.environ['CAI_SECRETS_KEY'].encode())
    return box


def _rewrite(change) -> None:
    connection = op.get_bind()
    rows = list(connection.execute(sa.select(SECRETS.c.agent_id, SECRETS.c.key, SECRETS.c.value)))
    model_key = connection.execute(sa.select(SETTINGS.c.value).where(SETTINGS.c.key == MODEL_KEY)).scalar()
    if not rows and not model_key:
        return
    box = _box()
    if box is None:
        raise RuntimeError("agent secrets are sealed with the platform's key: run this migration through "
                           "`caiplatform serve` (the data directory's secrets.key) or set CAI_SECRETS_KEY")
    for agent_id, key, value in rows:
        new = change(box, value)
        if new != value:
            connection.execute(sa.update(SECRETS).where(SECRETS.c.agent_id == agent_id, SECRETS.c.key == key)
                               .values(value=new))
    if model_key:
        connection.execute(sa.update(SETTINGS).where(SETTINGS.c.key == MODEL_KEY).values(value=change(box, model_key)))


def upgrade() -> None:
    from caiplatform.secret_box import is_sealed
    _rewrite(lambda box, value: value if is_sealed(value) else box.seal(value))


def downgrade() -> None:
    _rewrite(lambda box, value: box.open(value))
