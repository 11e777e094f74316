"""An OTLP/HTTP trace receiver for the benchmarks: answers every POST 200 with an empty
protobuf body and counts what it got ("exports bytes" on one line in the file argv[1],
rewritten after each POST). Prints its port (127.0.0.1, chosen by the kernel) on the first
line of stdout. Standard library only; it does not decode the spans (the tests' receiver does)."""
import http.server
import sys

stats = sys.argv[1]
got = [0, 0]


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        n = int(self.headers.get("content-length", 0))
        self.rfile.read(n)
        got[0] += 1
        got[1] += n
        with open(stats, "w") as f:
            f.write(f"{got[0]} {got[1]}\n")
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
