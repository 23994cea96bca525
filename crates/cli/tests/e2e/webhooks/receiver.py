"""A webhook receiver for the end-to-end test, verifying each delivery as
docs/webhooks.md tells a receiver to, with Python's own hmac: the HMAC-SHA256
of "<t>.<body>" under the secret, compared in constant time, and t within
five minutes of now.

    receiver.py DIR

DIR/port: the port it listens on (written once listening, on 127.0.0.1).
DIR/secret-<webhook id>: each webhook's secret, read at each delivery.
DIR/fail-until: answer 500 until this Unix time (absent: never).
DIR/log: a JSON line per delivery: the headers' delivery, event and webhook,
the body, whether its signature verified, and the status answered.
"""

import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DIR = sys.argv[1]


def verified(secret, header, body):
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    t, v1 = fields.get("t"), fields.get("v1")
    if t is None or v1 is None or abs(time.time() - int(t)) > 300:
        return False
    expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, v1)


class Hook(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        webhook = self.headers.get("Ebb-Webhook-Id", "")
        try:
            with open(os.path.join(DIR, f"secret-{webhook}")) as f:
                secret = f.read().strip()
        except OSError:
            secret = ""
        try:
            with open(os.path.join(DIR, "fail-until")) as f:
                failing = time.time() < float(f.read())
        except OSError:
            failing = False
        status = 500 if failing else 204
        entry = {
            "delivery": int(self.headers.get("Ebb-Delivery", "0")),
            "event": self.headers.get("Ebb-Event"),
            "webhook": webhook,
            "path": self.path,
            "verified": verified(secret, self.headers.get("Ebb-Signature", ""), body),
            "body": json.loads(body),
            "status": status,
        }
        with open(os.path.join(DIR, "log"), "a") as f:
            f.write(json.dumps(entry) + "\n")
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
with open(os.path.join(DIR, "port.new"), "w") as f:
    f.write(str(server.server_address[1]))
os.rename(os.path.join(DIR, "port.new"), os.path.join(DIR, "port"))
server.serve_forever()
