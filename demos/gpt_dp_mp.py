"""Train a small GPT with data and Megatron tensor parallelism; check it against one process.

    mpiexec -n 4 python demos/gpt_dp_mp.py [--mesh 2x2] [--dtype float64|float32] [--steps 20]
                                           [--sharding 1|2|3]

Token embedding (vocabulary-parallel: its rows split over "mp") + position embedding, two
transformer blocks sharded by dt.nn.megatron_plan (q/k/v and mlp.fc1 column-parallel,
attn.proj and mlp.fc2 row-parallel), a final LayerNorm and an lm head whose logits are split
over the vocabulary, so the cross entropy is vocabulary-parallel (only per-row statistics
move, never the logits). The batch is split over "dp". The model learns a repeating token
pattern; the losses, the last step's gradients and the final parameters must equal the
single-process run (relative 1e-9 in float64, 1e-5 in float32) and the loss must go down.
``--sharding K`` splits the optimizer state (1), the gradients (2) and the parameters between
steps (3) over "dp" with ``dt.shard_optimizer(opt, dt.ShardingStageK("dp"))`` and prints what
each rank holds (``dt.memory_report``).
"""

from __future__ import annotations

import numpy as np
from _common import (
    check,
    data_parallel,
    fail,
    fit,
    mesh_2d,
    ok,
    options,
    perturb,
    single_mesh,
)

import disttensor as dt

VOCAB, DIM, HEADS, SEQ, BATCH, LAYERS = 64, 32, 4, 16, 8, 2


class GPT(dt.nn.Module):
    def __init__(self, dtype) -> None:
        super().__init__()
        self.tok = dt.nn.Embedding(VOCAB, DIM, std=0.1, dtype=dtype)
        self.pos = dt.nn.Embedding(SEQ, DIM, std=0.1, dtype=dtype)
        self.blocks = dt.nn.ModuleList(
            [dt.nn.TransformerBlock(DIM, HEADS, dtype=dtype) for _ in range(LAYERS)]
        )
        self.ln_f = dt.nn.LayerNorm(DIM, dtype=dtype)
        self.head = dt.nn.Linear(DIM, VOCAB, bias=False, dtype=dtype)

    def forward(self, ids):
        # positions made where ids live (on a GPU too: host arrays do not mix with device
        # tensors), replicated: every rank computes them, nothing moves
        where = {"mesh": ids.mesh, "placements": [dt.Replicate()] * ids.mesh.ndim}
        x = self.tok(ids) + self.pos(dt.arange(ids.shape[1], **where))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (batch, seq, vocab) logits


PLAN = {
    "tok": dt.nn.VocabParallel("mp"),  # embedding rows (the vocabulary) split
    **dt.nn.megatron_plan("blocks.*", "mp"),
    "head": dt.nn.ColwiseParallel("mp"),  # logits split over the vocabulary
}


def batches(steps: int):
    """The same (ids, next ids) batches on every rank: windows of a repeating 40-token text."""
    rng = np.random.default_rng(0)
    text = np.tile(rng.integers(0, VOCAB, 40), 8)
    for _ in range(steps):
        start = rng.integers(0, len(text) - SEQ - 1, BATCH)
        window = np.stack([text[s : s + SEQ + 1] for s in start])
        yield window[:, :-1], window[:, 1:]


STAGES = {1: dt.ShardingStage1, 2: dt.ShardingStage2, 3: dt.ShardingStage3}


def train(
    mesh: dt.ProcessMesh,
    steps: int,
    dtype,
    show: bool = False,
    bad: bool = False,
    dp="plain",
    sharding: int = 0,
):
    """Train on ``mesh`` (2-D: sharded; one rank: the single-process program); ``dp``
    "fused" reduces the data-parallel gradients with dt.DataParallel; ``sharding`` K > 0
    shards the model state over "dp" with ShardingStageK."""
    dt.manual_seed(0)  # the same initial weights on every mesh
    model = GPT(dtype)
    sharded = mesh.ndim == 2
    dt.shard_layer(model, mesh, dt.nn.plan_shard_fn(PLAN) if sharded else None)
    if bad:
        perturb(model.blocks[0].mlp.fc1.weight)
    # eps 1e-4, not 1e-8: Adam steps by g / (|g| + eps), so a gradient item that cancels to
    # almost zero (1e-9, say) would move by ~lr with a size set by rounding, and a float32 run
    # would differ from itself under any other summation order by ~1e-3 after one step.
    opt = dt.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-4, weight_decay=0.01)
    placements = [dt.Shard(0), dt.Replicate()] if sharded else [dt.Replicate()]
    wrapper = data_parallel(model, mesh, dp)
    net = wrapper or model  # the wrapper's forward is the model's
    if sharding and sharded:
        opt = dt.shard_optimizer(opt, STAGES[sharding]("dp"))

    def loss_of(batch):
        ids, labels = (dt.shard_tensor(a, mesh, placements) for a in batch)
        return dt.cross_entropy(net(ids), labels)  # class axis split: vocab-parallel

    result = fit(opt, batches(steps), loss_of, model.named_parameters, steps, show, wrapper)
    if show and sharding:
        held = dt.memory_report(model, opt)  # after the last step, before zero_grad
        dt.print0(
            f"ShardingStage{sharding}: rank 0 holds {held['parameters']:,} bytes of parameters, "
            f"{held['gradients']:,} of gradients, {held['optimizer_state']:,} of optimizer "
            f"state and {held['buffers']:,} of communication buffers ({held['total']:,} in all)"
        )
    return result


def main() -> None:
    parser = options(__doc__, steps=20)
    parser.add_argument(
        "--sharding",
        type=int,
        choices=[0, 1, 2, 3],
        default=0,
        help="split the model state over dp: 1 optimizer state, 2 and gradients, 3 and "
        "parameters (dt.shard_optimizer); 0 (default): not split",
    )
    args = parser.parse_args()
    mesh = mesh_2d(args.mesh)
    dtype = np.dtype(args.dtype)
    dp, mp = mesh.shape
    dt.print0(
        f"GPT: vocab {VOCAB}, dim {DIM}, {HEADS} heads, {LAYERS} blocks, seq {SEQ}, batch "
        f"{BATCH}, AdamW, {dtype}\nmesh {dp}x{mp} (dp x mp): batch split {dp} ways; "
        f"embedding, blocks and lm head tensor-parallel {mp} ways"
    )
    sharded = train(
        mesh, args.steps, dtype, show=True, bad=args.perturb, dp=args.dp, sharding=args.sharding
    )
    single = train(single_mesh(), args.steps, dtype)
    worst = check(sharded, single, args.dtype)
    losses = sharded["losses"]
    first, last = losses[1], losses[len(losses)]
    if args.steps >= 5 and not last < 0.7 * first:
        fail(f"FAIL: the loss did not go down enough ({first:.4f} -> {last:.4f})", code=1)
    dt.print0(f"loss {first:.4f} -> {last:.4f}")
    ok(worst, args.dtype)


if __name__ == "__main__":
    main()
