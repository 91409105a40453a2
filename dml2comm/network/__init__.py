"""Network: topologies and the cost of collectives on them.

- :mod:`.kinds`: closed sets (collective kinds as in NCCL, algorithms, protocols, parallel dims).
- :mod:`.collectives`: one alpha-beta formula per (collective, algorithm), registered with
  ``@collective_time``; scalar or numpy-vectorised (:func:`~.collectives.collective_time_vec`).
- :mod:`.topology`: ring, tree, switch, fat-tree, 2D mesh, 2D/3D torus, fully connected and
  hierarchical clusters as stacks of levels; which links a group uses and how many hops.
- :mod:`.nccl`: NCCL's tuning constants (base latencies, protocols) and the calibration.
- :mod:`.model`: :func:`~.model.collective_cost_for_group` and :func:`~.model.cost_on_topology`,
  which compose the above and pick the fastest algorithm.
- :mod:`.units`, :mod:`.command`: the ``collective`` command.

Import from the submodules; this package imports nothing eagerly so that ``dml2comm.hardware``
and ``dml2comm.network.kinds`` stay importable without the cost models.
"""
