"""where an artifact's bytes live (object store)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02

* ``artifact_blobs.location`` (string, not null, default ``database``): ``database`` when
  the bytes are the blob's ``artifact_chunks`` rows, ``s3`` when they are an object in the
  store named by ``TUNECACHE_ARTIFACT_STORE`` (:mod:`tunecache.service.artifact_store`).
  Every existing blob is in the database; ``tunecache db move-artifacts`` moves them.

Downgrade drops the column (refuse it while blobs live in the object store: their bytes
would no longer be found).
"""
from alembic import op
import sqlalchemy as sa


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # ALTER TABLE ADD COLUMN on both databases (no table rebuild on SQLite)
    op.add_column('artifact_blobs', sa.Column('location', sa.String(16), nullable=False, server_default='database'))


def downgrade() -> None:
    moved = op.get_bind().execute(sa.text("SELECT count(*) FROM artifact_blobs WHERE location <> 'database'")).scalar()
    if moved:
        raise RuntimeError(f"{moved} artifacts live in the object store: move them back first "
                           "(tunecache db move-artifacts --to database)")
    with op.batch_alter_table('artifact_blobs') as batch:
        batch.drop_column('location')
