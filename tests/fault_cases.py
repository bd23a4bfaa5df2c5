"""The bad-input rows of the fault table (tests/fault_table.py says how rows run): bad meshes,
placements, dtypes, shapes and indices, layers, gradients and optimizers. Every rank must raise
the same clear error; tests/fault_ranks.py holds the rows about ranks that diverge, edge values
and programs that end the job.

``mpiexec -n N python tests/fault_cases.py`` runs every row and prints one verdict line each;
``mpiexec -n N python tests/fault_cases.py exit NAME`` runs one job-ending program.
"""

from __future__ import annotations

import sys

import fault_ranks  # noqa: F401  (registers its rows and programs)
import numpy as np
from fault_table import S0, S1, R, early, main, mesh, param, raises, rank, xs

import disttensor as dt


# -- bad meshes ---------------------------------------------------------------------------------
@raises(ValueError, "init_mesh: every mesh dim needs a size >= 1", absent=["mpiexec -n -"])
def init_mesh_negative_size(world):
    dt.init_mesh((-1, 2))


@raises(ValueError, "every mesh dim needs a size >= 1, got shape (0,)", absent=["mpiexec -n 0"])
def init_mesh_zero_size(world):
    dt.init_mesh(0)


@raises(TypeError, "init_mesh: shape must be an int or a sequence of ints")
def init_mesh_float_size(world):
    dt.init_mesh(world + 0.5)


@raises(ValueError, lambda w: f"needs {w + 1} ranks but the world has {w}; launch with mpiexec")
def init_mesh_more_ranks_than_the_world(world):
    dt.init_mesh((world + 1,))


@raises(ValueError, "dim_names must be 1 strings")
def init_mesh_names_of_another_length(world):
    dt.init_mesh((world,), dim_names=["dp", "mp"])


@raises(ValueError, "ProcessMesh ranks must be distinct; repeated: [0]")
def mesh_repeats_a_rank(world):
    dt.ProcessMesh([0, 0])


@raises(ValueError, lambda w: f"the mesh has ranks [{w}] but the world has only {w} ranks")
def mesh_names_a_rank_outside_the_world(world):
    dt.shard_tensor(np.ones(4), dt.ProcessMesh(list(range(world + 1))), [R])


@raises(ValueError, "mesh dim 'tp' is not in this mesh's dim_names ['dp']")
def mesh_dim_name_unknown(world):
    mesh(world)["tp"]


# -- bad placements -----------------------------------------------------------------------------
@raises(ValueError, "Shard(dim=1) is out of range")
def shard_axis_out_of_range(world):
    dt.shard_tensor(np.ones(4), mesh(world), [S1])


@raises(ValueError, "placements has 2 entries but the mesh has 1 dims")
def more_placements_than_mesh_dims(world):
    dt.shard_tensor(np.ones((4, 4)), mesh(world), [S0, R])


@raises(TypeError, "placements must be a list with one Placement per mesh dim")
def placements_not_a_list(world):
    dt.zeros((4,), mesh=mesh(world), placements=S0)


@raises(TypeError, "placements[0] is None")
def placement_none(world):
    dt.shard_tensor(np.ones(4), mesh(world), [None])


@raises(ValueError, "Partial(reduce_type='prod') is not supported")
def partial_of_an_unknown_reduction(world):
    dt.ones((4,), mesh=mesh(world), placements=[dt.Partial("prod")])


@raises(TypeError, "Partial(reduce_type='avg') needs a floating or complex dtype, got int64")
def partial_avg_of_integers(world):
    dt.ones((4,), dtype=np.int64, mesh=mesh(world), placements=[dt.Partial("avg")])


@raises(TypeError, "Shard(dim) needs an int tensor axis, got '0'")
def shard_of_a_string_axis(world):
    dt.Shard("0")


@raises(ValueError, "placements[0] = Shard(dim=3) is out of range for a tensor with 1 axes")
def reshard_to_an_axis_out_of_range(world):
    dt.reshard(xs(world), mesh(world), [dt.Shard(3)])


@raises(TypeError, "reshard needs a DistTensor, got ndarray")
def reshard_of_a_numpy_array(world):
    dt.reshard(np.ones(4), mesh(world), [R])


# -- dtypes ---------------------------------------------------------------------------------------
@raises(TypeError, "astype: a DistTensor's dtype must be bool or numeric, got object")
def astype_object(world):
    x = xs(world)
    early(lambda: x.astype(object))


@raises(TypeError, "astype: a DistTensor's dtype must be bool or numeric, got object")
def np_astype_object(world):
    x = xs(world)
    early(lambda: np.astype(x, object))  # not retried through the gathering fallback


@raises(TypeError, "must be bool or numeric, got <U5")
def astype_string(world):
    x = xs(world)
    early(lambda: x.astype("U5"))


@raises(TypeError, "shard_tensor needs numeric data, got an object array")
def shard_tensor_of_objects(world):
    dt.shard_tensor(np.array([1, "a", None], dtype=object), mesh(world), [R])


@raises(TypeError, "shard_tensor: dtype must be bool or numeric, got <U1")
def shard_tensor_of_strings(world):
    dt.shard_tensor(np.array(["a", "b"]), mesh(world), [S0])


@raises(TypeError, "only floating tensors can have gradients, got dtype int64")
def integer_tensor_requires_grad(world):
    dt.ones((4,), dtype=np.int64, mesh=mesh(world)).requires_grad_()


@raises(TypeError, "rand: dtype must be float32")
def rand_of_integers(world):
    dt.rand((4,), dtype=np.int64, mesh=mesh(world))


@raises(TypeError, "zeros: dtype must be bool or numeric, got object")
def zeros_of_objects(world):
    dt.zeros((4,), dtype=object, mesh=mesh(world))


# -- shapes and indices ---------------------------------------------------------------------------
@raises(ValueError, "operands could not be broadcast together")
def add_shapes_that_do_not_broadcast(world):
    xs(world) + np.ones(3)


@raises(ValueError, "matmul: Input operand 1 has a mismatch in its core dimension 0")
def matmul_of_mismatched_shapes(world):
    a = dt.ones((2 * world, 3), mesh=mesh(world), placements=[S0])
    a @ dt.ones((2, 3), mesh=mesh(world))


@raises(IndexError, lambda w: f"index {2 * w} is out of bounds for axis 0 with size {2 * w}")
def index_out_of_bounds(world):
    xs(world)[2 * world]


@raises(IndexError, "only integers, slices")
def index_by_a_float(world):
    xs(world)[1.5]


@raises(IndexError, "out of bounds")
def write_out_of_bounds(world):
    x = xs(world)
    x[100] = 1.0


@raises(IndexError, "boolean index did not match")
def boolean_mask_of_another_length(world):
    xs(world)[np.ones(3, bool)]


@raises(ValueError, "cannot reshape")
def reshape_to_a_wrong_size(world):
    xs(world).reshape(5, -1)


@raises(np.exceptions.AxisError, "axis 1 is out of bounds for array of dimension 1")
def sum_over_a_missing_axis(world):
    xs(world).sum(axis=1)


@raises(ValueError, "axes (0, 0) are not a permutation of the 2 axes")
def transpose_with_a_repeated_axis(world):
    dt.ones((2, world), mesh=mesh(world), placements=[S1]).transpose(0, 0)


@raises(ValueError, "negative dimensions are not allowed")
def zeros_of_a_negative_shape(world):
    dt.zeros((-1, 2), mesh=mesh(world))


@raises(
    ValueError, "concatenate: all the input arrays must have the same shape except along axis 0"
)
def concatenate_mismatched_shapes(world):
    a = dt.ones((2 * world, 2), mesh=mesh(world), placements=[S0])
    np.concatenate([a, dt.ones((2 * world, 3), mesh=mesh(world), placements=[S0])], axis=0)


@raises(dt.RanksDiverged, "rank 1: dtensor_from_local (", "local shape (3,) where (2,) fits")
def local_shard_of_a_wrong_shape(world):
    local = np.zeros(3 if rank() == 1 else 2)
    dt.dtensor_from_local(local, mesh(world), [S0], global_shape=(2 * world,))


@raises(ValueError, "dtensor_from_local: the shards cannot form a global tensor")
def local_shards_that_form_no_tensor(world):
    dt.dtensor_from_local(np.zeros(3 if rank() == 1 else 2), mesh(world), [S0])


# -- layers, gradients, optimizers ----------------------------------------------------------------
@raises(ValueError, "Linear: in_features must be >= 0, got -4", absent=["math domain error"])
def linear_of_negative_in_features(world):
    dt.nn.Linear(-4, 3, mesh=mesh(world))


@raises(ValueError, "Linear: out_features must be >= 0, got -3")
def linear_of_negative_out_features(world):
    dt.nn.Linear(4, -3, mesh=mesh(world))


@raises(TypeError, "Linear: in_features must be an int, got 4.5")
def linear_of_a_float_size(world):
    dt.nn.Linear(4.5, 3, mesh=mesh(world))


@raises(TypeError, "LayerNorm: normalized_shape must be an int, got 2.5")
def layer_norm_of_a_float_size(world):
    dt.nn.LayerNorm(2.5, mesh=mesh(world))  # int(2.5) would truncate to 2


@raises(TypeError, "assigned grad must be a DistTensor or None, got ndarray")
def grad_assigned_a_numpy_array(world):
    w = param(world)
    w.grad = np.ones(4)


@raises(ValueError, "assigned grad has shape (5,), but the tensor has (4,)")
def grad_of_a_wrong_shape(world):
    w = param(world)
    w.grad = dt.ones((5,), mesh=mesh(world))


@raises(TypeError, "assigned grad has dtype float32, but the tensor has float64")
def grad_of_a_wrong_dtype(world):
    w = param(world)
    w.grad = dt.ones((4,), dtype=np.float32, mesh=mesh(world))


@raises(TypeError, "cannot assign ndarray as parameter 'weight' of Linear")
def numpy_array_assigned_to_a_parameter(world):
    layer = dt.nn.Linear(2, 3, mesh=mesh(world))
    layer.weight = np.ones((2, 3))


@raises(ValueError, "Linear.weight: a parameter must be a leaf that requires a gradient")
def computed_tensor_assigned_to_a_parameter(world):
    layer = dt.nn.Linear(2, 3, mesh=mesh(world))
    layer.weight = layer.weight * 2


@raises(ValueError, "optimizer: can't optimize a non-leaf tensor")
def optimizer_of_a_non_leaf(world):
    dt.optim.Adam([param(world) * 2], lr=0.1)


@raises(ValueError, "is Partial [Partial(reduce_type='sum')]; reshard it")
def optimizer_of_a_partial_parameter(world):
    w = dt.ones((4,), mesh=mesh(world), placements=[dt.Partial()]).requires_grad_()
    dt.optim.SGD([w], lr=0.1)


@raises(ValueError, "learning rate must be >= 0")
def optimizer_of_a_negative_learning_rate(world):
    dt.optim.SGD([param(world)], lr=-1.0)


@raises(RuntimeError, "was written in place after the op used it", "optimizer step")
def backward_after_a_step_changed_the_leaves(world):
    w = param(world, [S0], (2 * world,))
    opt = dt.optim.SGD([w], lr=0.1)
    loss = (xs(world) * w * w).sum()
    loss.backward(retain_graph=True)
    opt.step()
    loss.backward()  # the graph still holds w's old value


@raises(RuntimeError, "backward through the graph a second time")
def backward_twice(world):
    w = param(world, [S0], (2 * world,))
    loss = (xs(world) * w * w).sum()
    loss.backward()
    loss.backward()


@raises(RuntimeError, "a tensor of shape (4,) needs an explicit gradient")
def backward_of_a_non_scalar(world):
    (param(world) * 2).backward()


@raises(RuntimeError, "in-place writes are not recorded for backward")
def in_place_write_to_a_parameter(world):
    w = param(world)
    w += 1


@raises(KeyError, "load_state_dict: missing keys ['bias']")
def state_dict_without_a_key(world):
    dt.nn.Linear(2, 3, mesh=mesh(world)).load_state_dict({"weight": np.ones((2, 3))})


@raises(ValueError, "load_state_dict: weight has shape (3, 2), the parameter has shape (2, 3)")
def state_dict_of_a_wrong_shape(world):
    layer = dt.nn.Linear(2, 3, mesh=mesh(world))
    layer.load_state_dict({"weight": np.ones((3, 2)), "bias": np.ones(3)})


if __name__ == "__main__":
    main(sys.argv[1:])
