"""What the client and its workers both use to talk: the per-fit channel (:mod:`.channel`), shared
memory on one host (:mod:`.shm`), a typed message as a Dask RPC (:mod:`.rpc`), the flat parameter
buffers (:mod:`.parameters`), seeded random draws (:mod:`.seeding`) and the optimizer settings a
step carries (:mod:`.optimizer_plan`).  The messages themselves are records (:mod:`adadamp.records`).

This layer imports only :mod:`adadamp.exceptions` and :mod:`adadamp.records`; the worker layer
(:mod:`adadamp.worker`) and the engine (:mod:`adadamp.engine`) import it, never the reverse.
"""
