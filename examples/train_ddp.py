"""Train a small BERT classifier with DistributedDataParallel on anyshape-compiled code.

Run on CPU (gloo backend), two processes:

    torchrun --nproc_per_node=2 examples/train_ddp.py [--mode compile|optimize] [--steps N]

``--mode compile`` wraps ``DDP(torch.compile(model, backend="anyshape", dynamic=True))``:
TorchDynamo captures the model and anyshape compiles its forward and backward graphs.
``--mode optimize`` wraps ``DDP(anyshape.optimize(model, example, training=True))``: one
forward and one backward compilation serve every batch size and sequence length.

The model is a transformers ``BertForSequenceClassification`` with random weights (no
download) and dropout 0, so runs are deterministic. Each step draws a seeded global batch
(the same on every rank) of a new size and sequence length, with padded attention masks;
every rank trains on its own equal-sized shard. At the end rank 0 prints the loss per
step, and every rank prints ``anyshape.stats()`` as a ``STATS {json}`` line.

``--single`` runs the same global batches in one process with eager PyTorch, no DDP, as a
reference (``python examples/train_ddp.py --single --world 2``). ``--save PATH`` writes
the final ``state_dict`` (rank 0; every rank to ``PATH.rank{r}`` with ``--save-all``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import transformers
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

import anyshape

VOCAB = 200


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights in every process
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        attn_implementation="sdpa",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout=0.0,
        num_labels=2,
        problem_type="single_label_classification",
    )
    return transformers.BertForSequenceClassification(config).train()


def global_batch(step: int, world: int, seed: int) -> dict[str, torch.Tensor]:
    """The batch of ``step`` for all ranks together: ``world`` shards of 2..4 rows each,
    sequence length 8..48, each row padded after a random length (at least half)."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    per_rank = int(torch.randint(2, 5, (), generator=g))
    seq = int(torch.randint(8, 49, (), generator=g))
    rows = world * per_rank
    lengths = torch.randint(seq // 2, seq + 1, (rows,), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    ids = torch.randint(1, VOCAB, (rows, seq), generator=g) * mask  # 0 (pad) past the length
    labels = torch.randint(0, 2, (rows,), generator=g)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def shard(batch: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, torch.Tensor]:
    # Equal shards: DDP averages the ranks' gradients, and the mean over ranks of each
    # shard's mean-loss gradient is the gradient of the global batch's mean loss only
    # when every shard has the same number of rows. So --single (one process, the mean
    # loss over the whole global batch) takes exactly the same optimizer steps.
    rows = batch["labels"].shape[0] // world
    return {k: v[rank * rows : (rank + 1) * rows] for k, v in batch.items()}


def wrap(model: torch.nn.Module, mode: str, example: dict) -> torch.nn.Module:
    if mode == "compile":
        return DDP(torch.compile(model, backend="anyshape", dynamic=True))
    return DDP(anyshape.optimize(model, example, training=True))


def train(args) -> tuple[list[float], torch.nn.Module]:
    if args.single:
        rank, world = 0, args.world
    else:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    runner = model
    if not args.single:
        runner = wrap(model, args.mode, shard(global_batch(0, world, args.seed), rank, world))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        batch = global_batch(step, world, args.seed)
        if not args.single:
            batch = shard(batch, rank, world)
        optimizer.zero_grad(set_to_none=True)
        loss = runner(**batch).loss
        loss.backward()  # (DDP all-reduces the gradients, averaging them over ranks)
        optimizer.step()
        mean = loss.detach().clone()
        if not args.single:
            dist.all_reduce(mean)
            mean /= world
        losses.append(mean.item())
    if not args.single:
        # (one write per line: the ranks share stdout, which may be unbuffered)
        sys.stdout.write("STATS " + json.dumps({"rank": rank, **anyshape.stats()}) + "\n")
        sys.stdout.flush()
    if args.save and (rank == 0 or args.save_all):
        path = f"{args.save}.rank{rank}" if args.save_all and not args.single else args.save
        torch.save(model.state_dict(), path)
    if rank == 0:
        tag = "single (eager)" if args.single else f"DDP x{world}, --mode {args.mode}"
        for step, value in enumerate(losses):
            print(f"step {step}: loss {value:.6f}  [{tag}]")
        print("LOSSES " + json.dumps(losses), flush=True)
        if not args.single:
            print(f"anyshape.stats() on rank 0: {anyshape.stats()}", flush=True)
    if not args.single:
        dist.barrier()
        dist.destroy_process_group()
    return losses, model


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["compile", "optimize"], default="optimize")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--single", action="store_true", help="one process, eager, no DDP")
    ap.add_argument(
        "--world",
        type=int,
        default=int(os.environ.get("WORLD_SIZE", 2)),
        help="shards per global batch with --single (default: 2)",
    )
    ap.add_argument("--save", help="write the final state_dict here (rank 0)")
    ap.add_argument("--save-all", action="store_true", help="every rank saves to SAVE.rank{r}")
    return ap.parse_args(argv)


@record  # (under torchrun: a failing rank's traceback shows in the launcher's summary)
def main(argv=None) -> None:
    train(parse(argv))


if __name__ == "__main__":
    main()
