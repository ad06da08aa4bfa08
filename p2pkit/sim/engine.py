"""A SIMULATED inference engine for the simulated host: refuses bad flags the way ninfer-serve
does, logs its start-up, then serves /health (503 while "loading", then 200) on the profile's
address. It stands in for the engine the (not yet built) engine stage would compile."""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from p2pkit.engine_cmd import NINFER_FLAGS

LOAD_SECONDS = float(os.environ.get("P2PKIT_SIM_LOAD_SECONDS", "1.5"))


def parse(argv: list[str]) -> tuple[str, dict]:
    if not argv or argv[0].startswith("-"):
        raise SystemExit("error: the artifact path comes first")
    artifact, flags, it = argv[0], {}, iter(argv[1:])
    for a in it:
        if not a.startswith("--") or "=" in a:
            raise SystemExit(f"error: unknown option {a}")
        name = a[2:]
        if name not in NINFER_FLAGS:
            raise SystemExit(f"error: unknown option {a}")
        if name in ("lm-head-draft", "vision"):
            flags[name] = True
        else:
            flags[name] = next(it, None)
    return artifact, flags


def main() -> None:
    print("ninfer-serve (SIMULATED) starting", flush=True)
    artifact, f = parse(sys.argv[1:])
    if not os.path.isfile(artifact):
        raise SystemExit(f"error: cannot open artifact {artifact}")
    fail = os.environ.get("P2PKIT_SIM_ENGINE_FAIL", "")
    if f.get("tp") == "2" and f.get("spec") == "dflash2" and not f.get("lm-head-draft"):
        raise SystemExit("Engine tp 2 DFlash2 requires the optimized proposal head")
    print(f"loading {artifact}", flush=True)
    if f.get("tp") == "2":
        print(f"tp 2 on devices {f.get('devices')}: all-reduce p2p on", flush=True)
    if fail == "kv":
        raise SystemExit("FATAL: KV cache does not fit: need 9.4 GiB, 7.3 GiB free (short by 2.1 GiB)")
    if f.get("spec"):
        print(f"spec {f['spec']}: draft tokens {f.get('draft-tokens')}, lm-head-draft "
              f"{'on' if f.get('lm-head-draft') else 'off'}", flush=True)
    started = time.monotonic()

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/health":
                self.send_error(404)
                return
            ok = time.monotonic() - started >= LOAD_SECONDS
            body = json.dumps({"status": "ok" if ok else "loading"}).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((f.get("host") or "127.0.0.1", int(f.get("port") or 12435)), Health)
    print(f"listening on {f.get('host')}:{f.get('port')}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
