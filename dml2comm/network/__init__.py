"""Network: closed sets of kinds (:mod:`.kinds`) and collective cost models (:mod:`.collectives`).

Import from the submodules; this package imports nothing eagerly so that ``dml2comm.hardware``
and ``dml2comm.network.kinds`` stay importable without the cost models.
"""
