"""Storage of each image's current run: the pointer per (key, environment, image) beside the
key's (``current_images``), and the lookup statement that reads it.

An *image* is the set of package versions a run's warm state is built with (torch, Triton,
TVM-FFI: :func:`tunecache.formats.dependencies.image_of` of its ``summary.dependencies``). A
fleet upgraded node by node runs two at once, in one FlashInfer environment; a run made on one
takes the key's current place, and the pods of the other would get a warm state they must
leave out. Each image's pointer moves with the key's for the runs of that image, so those pods
are answered with their own image's run (:func:`tunecache.service.repository.lookup`).

Like :mod:`~tunecache.service.repository`, it reads and writes rows and decides nothing
(:mod:`tunecache.service.publishing` decides which pointers move); none of it commits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Select, and_, case, select
from sqlalchemy.orm import Session, aliased

from tunecache.contract import EnvironmentMetadata, TuningKey
from tunecache.service import dialect
from tunecache.service.models import CurrentImage, CurrentTuning, Environment, TuningKeyRow, TuningRun, utcnow

if TYPE_CHECKING:
    from tunecache.service.repository import RunPlace


def make_current_image(session: Session, run_id: int, place: RunPlace, newer: str | None,
                       unless_set: bool = False) -> None:
    """Point the current run of ``place``'s image (for its key and environment) at run
    ``run_id`` (a place without an image has none), keeping the one before as
    ``previous_run_id``; ``newer``: as :func:`tunecache.service.repository.make_current`;
    ``unless_set``: only when the image has no current run yet."""
    if place.image is None:
        return
    values = {"key_id": place.key_id, "environment_id": place.environment_id, "image": place.image, "run_id": run_id,
              "updated_at": utcnow()}
    conflict = ["key_id", "environment_id", "image"]
    if unless_set:
        dialect.insert_or_ignore(session, CurrentImage.__table__, values, conflict=conflict)
    else:
        dialect.upsert_if_newer(session, CurrentImage.__table__, values, conflict=conflict, newer=newer,
                                keep_old={"previous_run_id": "run_id"})


def image_lookup(key: TuningKey, environment: EnvironmentMetadata, image: str) -> Select:
    """``SELECT`` of ``(run, the key's current run id)`` for a pod of ``image``: the key's
    current run, or, where that was made on another image and ``image`` has a current run of
    its own, that one. A run that records no image is every image's. One statement: the
    key's pointer by the key and environment, the image's by its primary key (an outer join),
    the run by its primary key."""
    key_run = aliased(TuningRun)
    other_image = and_(key_run.image.is_not(None), key_run.image != image, CurrentImage.run_id.is_not(None))
    return (
        select(TuningRun, CurrentTuning.run_id)
        .select_from(CurrentTuning)
        .join(TuningKeyRow, TuningKeyRow.id == CurrentTuning.key_id)
        .join(Environment, Environment.id == CurrentTuning.environment_id)
        .join(key_run, key_run.id == CurrentTuning.run_id)
        .outerjoin(CurrentImage, and_(CurrentImage.key_id == CurrentTuning.key_id,
                                      CurrentImage.environment_id == CurrentTuning.environment_id,
                                      CurrentImage.image == image))
        .join(TuningRun, TuningRun.id == case((other_image, CurrentImage.run_id), else_=CurrentTuning.run_id))
        .where(*(getattr(TuningKeyRow, f) == v for f, v in key.model_dump().items()),
               Environment.env_hash == environment.environment_hash())
    )
