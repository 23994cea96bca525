#!/usr/bin/env python3
"""Online serving, the counter-example: it runs on the on-demand tier (or
reserved), is never drained, and answers predictions over HTTP while batch
work fills the rest of the cluster on the preemptible tier.

    ebb submit --tier on-demand --restart always --name digits-api -- python3 examples/serve.py --port 8500
    curl 'http://127.0.0.1:8500/predict?row=17'

Writes its port to $EBB_CHECKPOINT_DIR/port when it is ready.
"""

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import numpy as np

import digits


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    data, y = digits.load()
    x = data / 16.0
    centroids = np.stack([x[y == c].mean(axis=0) for c in range(10)])

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            url = urlparse(self.path)
            try:
                row = int(parse_qs(url.query)["row"][0])
                label = int(((x[row] - centroids) ** 2).sum(axis=1).argmin())
                body, status = json.dumps({"row": row, "label": label}), 200
            except (KeyError, ValueError, IndexError) as e:
                body, status = json.dumps({"error": f"row: {e}"}), 400
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    port = server.server_address[1]
    ckpt = os.environ.get("EBB_CHECKPOINT_DIR")
    if ckpt:
        with open(os.path.join(ckpt, "port.tmp"), "w") as f:
            f.write(str(port))
        os.replace(os.path.join(ckpt, "port.tmp"), os.path.join(ckpt, "port"))
    print(f"serving on 127.0.0.1:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
