"""Run by `memwatch launch`: a Client made with no arguments finds the job, the token and the daemon
in the environment launch set, and takes the job as attached; so does one in a child process (a
torchrun rank, a DataLoader worker), and not one whose environment has only MEMWATCH_JOB. Prints what
it found as JSON."""

import json
import os
import subprocess
import sys

import memwatch

c = memwatch.Client()
assert c.attach()
d = c.directives(force=True)
ok = c.progress(0, 1, running={"workers": 0})


def child_launched(env):
    code = "import memwatch; print(memwatch.Client().launched)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip() == "True"


bare = {k: v for k, v in os.environ.items() if k != "MEMWATCH_LAUNCHED"}
print(json.dumps({"name": c.name, "token": bool(c.token), "directives": d is not None, "knobs": d.knobs if d else None,
                  "progress": ok, "resumed": c.resumed, "socket": c.socket_path, "url": c.url,
                  "launched": c.launched, "child_launched": child_launched(dict(os.environ)),
                  "child_without_marker_launched": child_launched(bare)}))
sys.exit(0 if d is not None and ok else 3)
