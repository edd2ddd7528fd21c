"""Where the slice's planning goes: every probe plan_packs runs, timed (GPU window diagnosis)."""
import sys, tempfile, time
from pathlib import Path
import torch
from nlmodels import set_up_numerics
set_up_numerics()
from tasks.config import MAIN_SYSTEMS, resolve_config
from tasks.engine import plan_packs
from tasks.placement import Probe, probe_pack

torch.set_num_threads(1)
cells = resolve_config("paper", overrides={"systems": MAIN_SYSTEMS, "seeds": [0, 1, 2, 3, 4],
                                           "training": {"epochs": 20}}).cells()
rows = []
def timed(cell, device, members):
    if str(device).startswith('cuda') and not torch.cuda.is_available():
        return Probe(0.01, 10**6)
    t0 = time.perf_counter()
    got = probe_pack(cell, device, members)
    dt = time.perf_counter() - t0
    rows.append((cell.method, cell.system, str(device), members, dt))
    print(f"probe {cell.method:15s} {cell.system:22s} {str(device):5s} x{members:<3d} {dt:7.2f} s -> {got.seconds:.4f}", flush=True)
    return got
t0 = time.perf_counter()
with tempfile.TemporaryDirectory() as tmp:
    placed = plan_packs(cells, pack=True, device="auto", cache_dir=Path(tmp), measure=timed,
                        **({} if len(sys.argv) < 2 else {'cuda_available': True, 'free_bytes': 10**11}))
total = time.perf_counter() - t0
print(f"plan_packs {total:.1f} s, probes {sum(r[4] for r in rows):.1f} s in {len(rows)} probes")
for m in sorted({r[0] for r in rows}):
    for d in ("cpu", "cuda"):
        s = sum(r[4] for r in rows if r[0] == m and r[2].startswith(d))
        print(f"  {m:15s} {d:5s} {s:7.1f} s")
print("packs:", [(len(p), p[0].method, d) for p, d in placed])
