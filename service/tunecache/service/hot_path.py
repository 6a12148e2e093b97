"""What a booting pod asks for, answered without the database where that is safe: the request
path's parts, one module each, named here together.

* :class:`LookupCache` (:mod:`tunecache.service.lookup_cache`): lookup answers (the
  serialized JSON body and its status) per ``(generation, key, environment)``. The generation (``repository.generation``) moves in
  the transaction that changes a current tuning, and a request reads it before it looks in
  the cache, so no pod gets a run older than one that was current when its request began,
  whichever process or replica answers.
* :class:`GenerationReader` (:mod:`~tunecache.service.lookup_cache` too): that read, shared.
  Requests that arrive while a read is in flight wait for the next one, which starts after all of them arrived; under a boot storm
  one single-row query serves every request that came in during the previous one.
* :class:`ArtifactFiles` (:mod:`tunecache.service.artifact_files`): artifacts mirrored from
  their store (the database, or the object store: :mod:`tunecache.service.artifact_store`)
  into files named by their sha256, and the small ones also held in memory. Artifacts are immutable, so a file, once
  written whole and verified, is served as it is (``FileResponse``: ``Range``, ``HEAD``)
  without a database connection; the download of a large one holds no connection while
  the pod reads it. Its size is capped by :meth:`ArtifactFiles.trim` (least recently used
  files first; ``TUNECACHE_MIRROR_MAX_BYTES``, :mod:`tunecache.service.retention`).
* :class:`SingleFlight` (:mod:`tunecache.service.single_flight`): one computation shared by
  the concurrent requests that ask for the same thing.
"""

from tunecache.service.artifact_files import ArtifactFiles, Trimmed
from tunecache.service.lookup_cache import GenerationConnection, GenerationReader, LookupCache
from tunecache.service.single_flight import SingleFlight

__all__ = ["ArtifactFiles", "GenerationConnection", "GenerationReader", "LookupCache", "SingleFlight", "Trimmed"]
