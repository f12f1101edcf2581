import json, os, sys, time
sys.path.insert(0, "bindings/python")
from ifec import gpu_profile as g
out, run, graphs = os.environ["OUT"], os.environ["RUN"], os.environ.get("EAGER") is None
t0 = time.time()
lines = []
rows = g.measure((8, 16, 32, 64, 128, 256), (32, 64, 128, 256, 512, 1024, 4096), graphs=graphs, progress=lines.append)
json.dump({"rows": [list(r) for r in rows], "log": lines}, open(f"{out}/{run}.json", "w"))
print(f"== {run} {time.time() - t0:.0f} s; {lines[0]}", flush=True)
