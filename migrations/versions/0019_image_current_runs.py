"""images: a current run per image, and the kinds pods lost to another image's run

Revision ID: 0019
Revises: 0018
Create Date: 2027-01-12

A fleet upgraded node by node runs two images (other torch, Triton or TVM-FFI, the same
FlashInfer environment) at once; a run made on one must not take the current place of the
pods on the other.

* ``tuning_runs.image`` (16 hex digits, null where the run records no package versions): the
  image of its ``summary.dependencies`` (:func:`tunecache.formats.dependencies.image_of`),
  filled here for the runs already stored;
* ``current_images``: the current run of each (key, environment, image), beside
  ``current_tunings``; filled here from the current runs of keys and of engine variants (per
  image the key's current run, else the newest current run of one of its variants);
* ``pod_reports.missing_kinds``: the kinds of the installed run a pod left out as built on
  another image (comma-separated).

Downgrade drops them.
"""
import datetime as dt
import hashlib
import json

from alembic import op
import sqlalchemy as sa


revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None

#: The distributions of ``tunecache.formats.dependencies.DISTRIBUTIONS`` at this revision.
_DISTRIBUTIONS = ("apache-tvm-ffi", "torch", "triton")
#: Runs read per batch of the backfill.
_BATCH = 500


def _image_of(versions):
    """``tunecache.formats.dependencies.image_of`` at this revision."""
    if not isinstance(versions, dict):
        return None
    lines = [f"{name}=={str(versions[name])[:64]}" for name in _DISTRIBUTIONS if versions.get(name) is not None]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16] if lines else None


def upgrade() -> None:
    op.add_column('tuning_runs', sa.Column('image', sa.String(16), nullable=True))
    op.create_table(
        'current_images',
        sa.Column('key_id', sa.Integer(), nullable=False),
        sa.Column('environment_id', sa.Integer(), nullable=False),
        sa.Column('image', sa.String(16), nullable=False),
        sa.Column('run_id', sa.Integer(), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('previous_run_id', sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(['environment_id'], ['environments.id'],
                                name=op.f('fk_current_images_environment_id_environments')),
        sa.ForeignKeyConstraint(['key_id'], ['tuning_keys.id'], name=op.f('fk_current_images_key_id_tuning_keys')),
        sa.ForeignKeyConstraint(['run_id'], ['tuning_runs.id'], name=op.f('fk_current_images_run_id_tuning_runs')),
        sa.PrimaryKeyConstraint('key_id', 'environment_id', 'image', name=op.f('pk_current_images')),
    )
    op.create_index('ix_current_images_run_id', 'current_images', ['run_id'])
    op.add_column('pod_reports', sa.Column('missing_kinds', sa.String(255), nullable=True))
    _backfill()


def _backfill() -> None:
    connection = op.get_bind()
    runs = sa.table('tuning_runs', sa.column('id', sa.Integer), sa.column('summary', sa.JSON),
                    sa.column('image', sa.String))
    last = 0
    while True:
        batch = connection.execute(sa.select(runs.c.id, sa.cast(runs.c.summary, sa.Text)).where(runs.c.id > last)
                                   .order_by(runs.c.id).limit(_BATCH)).all()
        if not batch:
            break
        last = batch[-1][0]
        for run_id, summary in batch:
            try:
                image = _image_of(json.loads(summary).get("dependencies")) if summary else None
            except (ValueError, AttributeError):
                image = None
            if image is not None:
                connection.execute(runs.update().where(runs.c.id == run_id).values(image=image))
    now = dt.datetime.now(dt.timezone.utc)
    pointers = {}
    for table in ('current_variants', 'current_tunings'):  # the key's own last: it wins
        rows = connection.execute(sa.text(
            f"SELECT p.key_id, p.environment_id, r.image, p.run_id FROM {table} p "
            "JOIN tuning_runs r ON r.id = p.run_id WHERE r.image IS NOT NULL ORDER BY p.run_id")).all()
        for key_id, environment_id, image, run_id in rows:
            pointers[(key_id, environment_id, image)] = run_id
    if pointers:
        current_images = sa.table('current_images', sa.column('key_id'), sa.column('environment_id'),
                                  sa.column('image'), sa.column('run_id'), sa.column('updated_at', sa.DateTime))
        connection.execute(current_images.insert(), [
            {"key_id": k, "environment_id": e, "image": i, "run_id": r, "updated_at": now}
            for (k, e, i), r in pointers.items()])


def downgrade() -> None:
    with op.batch_alter_table('pod_reports') as batch:
        batch.drop_column('missing_kinds')
    op.drop_index('ix_current_images_run_id', table_name='current_images')
    op.drop_table('current_images')
    with op.batch_alter_table('tuning_runs') as batch:
        batch.drop_column('image')
