"""Run by `memwatch launch`: a Client made with no arguments finds the job, the token and the daemon
in the environment launch set. Prints what it found as JSON."""

import json
import sys

import memwatch

c = memwatch.Client()
d = c.directives(force=True)
ok = c.progress(0, 1, running={"workers": 0})
print(json.dumps({"name": c.name, "token": bool(c.token), "directives": d is not None, "knobs": d.knobs if d else None,
                  "progress": ok, "resumed": c.resumed, "socket": c.socket_path, "url": c.url}))
sys.exit(0 if d is not None and ok else 3)
