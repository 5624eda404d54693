"""How policy weights travel from a collector to its children, and their children.

The path of one update to a grandchild, file by file:

1. `collectors/weight_conventions.py` `update_policy_weights_` (written once for every
   collector) calls the collector's `apply_weights`.
2. `weights/sender.py` (`SentWeights`): the parent checks the update against the policy's
   names, shapes and dtypes (`policy/weights.py`), detaches it and keeps a copy of what the
   children hold, so that a restarted child starts from it.
3. `weights/schemes.py` (or `weights/ray_scheme.py` for Ray actors): the scheme packs the
   weights once, into shared memory, a pickled payload or the Ray object store.
4. `multiprocess/pool.py` sends one `UPDATE_WEIGHTS` command per worker over
   `runtime/processes.py`'s pipes (`ray/fleet.py` calls each actor instead).
5. `multiprocess/worker.py` (or `ray/actor.py`): the child unpacks, copies the weights into its
   own policy and, when it has children of its own, repeats steps 2-5 for them before it
   acknowledges.
6. `single/control.py` and `policy/holder.py`: the innermost collector loads the weights into
   the policy it runs and bumps its policy version.

The parent returns only once every child of the tree has acknowledged: after
`update_policy_weights_` returns, no batch is collected with the old weights. A scheme built
with `sync=False` (TorchRL's flag) returns once the update is sent; the next update waits for
its acknowledgements first. TorchRL's legacy `weight_updater` replaces step 1 (see
`collectors/legacy_updater.py`).
"""
