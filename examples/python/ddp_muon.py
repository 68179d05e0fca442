"""Muon and AdamW from muon_cpp under torchrun with DistributedDataParallel, on the CPU (Gloo).

    torchrun --standalone --nproc-per-node 2 examples/python/ddp_muon.py [--steps 30] [--out F]

Each rank takes its slice of the same global batch, DDP averages the gradients, and each
parameter is updated by one owner rank, which shares the result (docs/distributed.md). The global
batch is the same at every world size, so 1, 2 and 4 ranks train the same model, up to float32
round-off. Rank 0 prints the loss and, with --out, saves the final parameters there.
"""
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import muon_cpp

GLOBAL_BATCH = 16


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out")
    args = parser.parse_args()
    dist.init_process_group("gloo")  # torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same initial model on every rank
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 1)))
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    muon = muon_cpp.Muon(matrices, lr=0.02, process_group=dist.group.WORLD)
    adamw = muon_cpp.AdamW(others, lr=1e-3, process_group=dist.group.WORLD)
    data = torch.Generator().manual_seed(1)
    share = GLOBAL_BATCH // world
    for step in range(args.steps):
        x = torch.randn(GLOBAL_BATCH, 32, generator=data)  # the global batch, on every rank
        mine = x[rank * share:(rank + 1) * share]
        loss = torch.nn.functional.mse_loss(model(mine), mine.sum(1, keepdim=True))
        muon.zero_grad()
        adamw.zero_grad()
        loss.backward()  # DDP averages the ranks' gradients: the global batch's
        muon.step()  # each rank updates what it owns, then shares it
        adamw.step()
        if rank == 0 and (step % 10 == 9 or step == args.steps - 1):
            print(f"step {step + 1}: loss {loss.item():.4f} (rank 0's share)")
    if rank == 0 and args.out:
        torch.save([p.detach() for p in model.module.parameters()], args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
