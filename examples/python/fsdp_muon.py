"""Muon and AdamW from muon_cpp on a model sharded by FSDP2 (fully_shard), under torchrun on the
CPU (Gloo).

    torchrun --standalone --nproc-per-node 2 examples/python/fsdp_muon.py [--steps 30] [--out F]

fully_shard makes every parameter a DTensor whose rows are split over the ranks (Shard(0)); the
optimizers take them as they are, with no process group: the device mesh brings it. Each rank
takes its slice of the same global batch and FSDP2 averages the gradients into each rank's rows.
Muon gathers each matrix to one owner rank, orthogonalizes it there and scatters the new rows
back; AdamW updates every rank's own rows (docs/distributed.md §Python: parameters sharded by
FSDP2). The global batch is the same at every world size, so 1, 2 and 4 ranks train the same
model, up to float32 round-off.
Rank 0 prints the loss and, with --out, saves the final (whole) parameters there.
"""
import argparse
import gc

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

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
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    muon = muon_cpp.Muon(matrices, lr=0.02)
    adamw = muon_cpp.AdamW(others, lr=1e-3)
    data = torch.Generator().manual_seed(1)
    share = GLOBAL_BATCH // world
    for step in range(args.steps):
        x = torch.randn(GLOBAL_BATCH, 32, generator=data)  # the global batch, on every rank
        mine = x[rank * share:(rank + 1) * share]
        loss = torch.nn.functional.mse_loss(model(mine), mine.sum(1, keepdim=True))
        muon.zero_grad()
        adamw.zero_grad()
        loss.backward()  # FSDP2 averages the gradients into each rank's rows
        muon.step()  # each matrix gathered to its owner, orthogonalized, scattered back
        adamw.step()  # each rank its own rows
        if rank == 0 and (step % 10 == 9 or step == args.steps - 1):
            print(f"step {step + 1}: loss {loss.item():.4f} (rank 0's share)")
    whole = [p.full_tensor().detach() for p in model.parameters()]  # a collective
    if rank == 0 and args.out:
        torch.save(whole, args.out)
    # FSDP2's modules keep Gloo's work objects; freed only at exit, after the group is gone, they
    # can abort the process ("terminate called without an active exception": torch 2.15, with
    # torch.optim's optimizers too). Free them while the group lives.
    del model, muon, adamw, loss
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
