# A small training loop (for scripts/gpu-check.sh) on the GPU with 4 DataLoader workers; it holds as much GPU memory as the
# share of the card written in the file argv[1] says, re-read between steps.
import os, sys, time, torch
from torch.utils.data import DataLoader, Dataset

GiB = 1 << 30

class D(Dataset):
    def __len__(self):
        return 1 << 30
    def __getitem__(self, i):
        return torch.full((256,), float(i % 7))

def main():
    dl = DataLoader(D(), batch_size=64, num_workers=4, persistent_workers=True)
    it = iter(dl)
    next(it)
    dev = torch.device("cuda")
    w = torch.randn(256, 256, device=dev, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-3)
    free, total = torch.cuda.mem_get_info()
    print(f"READY pid={os.getpid()} total={total} free={free}", flush=True)
    held, last = [], None
    while True:
        try:
            t = float(open(sys.argv[1]).read().strip())
        except Exception:
            t = last or 0.0
        if t != last:
            free, total = torch.cuda.mem_get_info()
            used, want = total - free, int(t * total)
            while used < want - GiB // 2:
                held.append(torch.empty(min(GiB, want - used), dtype=torch.uint8, device=dev))
                free, total = torch.cuda.mem_get_info()
                used = total - free
            while used > want + GiB and held:
                held.pop()
                torch.cuda.empty_cache()
                free, total = torch.cuda.mem_get_info()
                used = total - free
            print(f"HOLD {t:.3f} used={used} total={total} chunks={len(held)}", flush=True)
            last = t
        x = next(it).to(dev)
        loss = (x @ w).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.05)

main()
