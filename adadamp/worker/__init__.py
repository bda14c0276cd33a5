"""Everything that runs inside a Dask worker process: the plugin whose handlers the client calls
(:mod:`.plugin`), a fit's state there (:mod:`.state`), the gradient of a share (:mod:`.gradient`),
the all-reduce replica (:mod:`.replica`; its group's formation :mod:`.generation`, rendezvous
:mod:`.rendezvous` and bucketed all-reduce :mod:`.buckets`; a group kept between fits
:mod:`.groups`), the examples placed on the worker (:mod:`.resident`) and a lazy Dataset's loader
(:mod:`.loading`).

It imports only the wire layer (:mod:`adadamp.wire`), the records and the exceptions: a worker
never imports the client side (no scikit-learn, no engine).
"""
