"""What the client and its workers both use to talk: the per-fit channel (:mod:`.channel`), shared
memory on one host (:mod:`.shm`), the flat parameter buffers (:mod:`.parameters`), seeded random
draws (:mod:`.seeding`) and the optimizer settings a step carries (:mod:`.optimizer_plan`).

This layer imports only :mod:`adadamp.exceptions` and :mod:`adadamp.records`; the worker layer
(:mod:`adadamp.worker`) and the engine (:mod:`adadamp.engine`) import it, never the reverse.
"""
